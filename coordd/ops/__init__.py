"""ops: TODO describe."""
