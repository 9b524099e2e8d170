"""sqlite: TODO describe."""
