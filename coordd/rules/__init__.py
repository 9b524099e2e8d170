"""rules: TODO describe."""
