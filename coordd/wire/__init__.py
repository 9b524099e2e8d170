"""wire: TODO describe."""
