"""drlc's own critic server and its backends (lexicon, hf), which answer through the real OpenAI-compatible client."""
