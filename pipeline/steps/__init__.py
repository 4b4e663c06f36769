"""The logic behind each DVC stage, one module per stage.

A stage script in stages/ parses its arguments, loads params, calls the one function here that
does the stage's work, and writes the result with pipeline.core.store. These functions take explicit
values (never the whole params object) and return rows.
"""
