"""daemon: TODO describe."""
