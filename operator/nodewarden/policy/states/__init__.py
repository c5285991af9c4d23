"""The power state machine's handlers, one module per state (`machine.HANDLERS`).

One-way calls: `machine` -> the state modules -> `moves` -> `context`.
"""
