"""coordd-web: a read-mostly web view of coordd, a client of its socket like coordctl."""
