"""The LLM critic: prompt templates, answer parsing, span-to-token alignment, offline critics,
and the transport (cache, client, local server).

Modules are imported directly (``from pipeline.critic.parse import parse_answer``); this
package file imports nothing so that loading one part never pulls in the others.
"""
