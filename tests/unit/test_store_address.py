"""coordd.store.dsn.store_address: where a DSN points, for "cannot reach the store"."""

from coordd.store.dsn import store_address


def test_a_unix_socket_dsn_names_its_folder_port_and_database():
    assert store_address("postgresql://coordd@/coordd?host=/run/pg&port=55499") == \
        "host /run/pg, port 55499, database coordd"


def test_a_tcp_dsn_names_host_and_port_never_the_password():
    text = store_address("postgresql://coordd:s3cret@db.example:6543/jobs")
    assert text == "host db.example, port 6543, database jobs"
    assert "s3cret" not in text


def test_libpq_defaults_are_said_where_absent():
    assert store_address("postgresql:///") == \
        "host the default socket folder, port 5432, database the user's name"
    assert store_address("postgresql://h/?dbname=x") == "host h, port 5432, database x"
