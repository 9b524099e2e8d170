"""What operators watch: the metrics registry (Prometheus text), which the SQLite writer,
the Coordinator and the server report into. May import wire and the base modules only;
the store, service and daemon import it (the layers contract).
"""
