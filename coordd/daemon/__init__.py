"""The daemon process: start-up and shut-down (server), the listeners it serves on
(serving, tcp), config reload and signals (reload). The top layer: it may import every
other package (service, store, net, ops, rules, wire) and the base modules; nothing in
coordd imports it.
"""
