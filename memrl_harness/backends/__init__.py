"""Where LLM-written actions run: sandboxes for shell and Python, SQL servers for SQL.

Each kind has one typed protocol (:mod:`.sandbox`, :mod:`.sql`) and its backends beside it; the benchmarks in
:mod:`memrl_harness.benchmarks` use the protocols and never import a backend's module directly but through
the factories. Nothing an agent writes may reach the host: see each backend's docstring for what it
guarantees and what it does not.
"""
