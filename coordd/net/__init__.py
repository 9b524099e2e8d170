"""The network layer, knowing nothing of jobs: frames and their budgets, the RPC
dispatcher and its connection scopes (rpc, parking), the Unix-socket listener, TLS and
the PKI, peer credentials, and the process's own limits (memory, fdlimit).
May import rules (names) and wire, and the base modules; never service, store, daemon or
ops (the layers contract).
"""
