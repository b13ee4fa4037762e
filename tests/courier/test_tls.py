"""Mutual TLS between courier servers and clients, with certificates from ``python -m jaxdist.tools.certs``:
calls (inline and staged) go through; a plaintext client, a client of another CA, a client
without a certificate and a server whose certificate names another host are all refused, and
the server goes on serving."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import grpc
import numpy as np
import pytest

from jaxdist.tools import certs

from jaxdist import courier
from jaxdist.courier.tls import TLS, TLS_DIR_ENV, TLS_NAME_ENV, from_environment

HOST = "127.0.0.1"


class Echo:
    def echo(self, value):
        return value


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("certs") / "run")
    done = subprocess.run([sys.executable, "-m", "jaxdist.tools.certs", directory, "--hosts", f"{HOST},m1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture
def server(ca_dir):
    server = courier.Server(Echo(), f"{HOST}:0", token="secret", tls=TLS.load(ca_dir, HOST)).start()
    yield server
    server.stop(grace=0)


def test_the_command_writes_a_ca_and_a_certificate_per_host_with_private_keys(ca_dir):
    names = sorted(os.listdir(ca_dir))
    assert names == ["127.0.0.1.key", "127.0.0.1.pem", "ca.key", "ca.pem", "m1.key", "m1.pem"]
    for name in names:
        mode = stat.S_IMODE(os.stat(os.path.join(ca_dir, name)).st_mode)
        assert mode == (0o600 if name.endswith(".key") else 0o644), (name, oct(mode))
    assert stat.S_IMODE(os.stat(ca_dir).st_mode) == 0o700
    ca = open(os.path.join(ca_dir, "ca.pem"), "rb").read()
    certs.make(ca_dir, ["m2"])  # a host added later: the CA stays, so the others stay valid
    assert open(os.path.join(ca_dir, "ca.pem"), "rb").read() == ca and os.path.exists(os.path.join(ca_dir, "m2.pem"))


def test_calls_inline_and_staged_go_through_tls(server, ca_dir):
    with courier.Client(server.address, token="secret", tls=TLS.load(ca_dir, HOST), timeout=10) as client:
        assert client.echo("hello") == "hello"
        big = np.arange(3_000_000, dtype=np.float32)  # 12 MB: chunked upload and download
        np.testing.assert_array_equal(client.echo(big), big)


def test_plaintext_and_foreign_clients_are_refused_and_the_server_goes_on(server, ca_dir, tmp_path):
    certs.make(str(tmp_path / "other"), [HOST])  # the same host name, another CA
    refused = [courier.Client(server.address, token="secret", timeout=3, wait_for_ready=False),
               courier.Client(server.address, token="secret", timeout=3, wait_for_ready=False,
                              tls=TLS.load(str(tmp_path / "other"), HOST))]
    for client in refused:
        with pytest.raises(courier.UnavailableError):
            client.echo("x")
        client.close()
    # A TLS client with the CA but no certificate of its own: mutual authentication refuses it.
    channel = grpc.secure_channel(server.address, grpc.ssl_channel_credentials(TLS.load(ca_dir, HOST).ca))
    with pytest.raises(grpc.RpcError) as error:
        channel.unary_unary("/jaxdist.Courier/echo")(b"", timeout=3)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()
    with courier.Client(server.address, token="secret", tls=TLS.load(ca_dir, HOST), timeout=10) as client:
        assert client.echo(1) == 1


def test_a_server_whose_certificate_names_another_host_is_refused(ca_dir):
    """What stops a process that took a node's address from answering its clients."""
    impostor = courier.Server(Echo(), f"{HOST}:0", token="secret", tls=TLS.load(ca_dir, "m1")).start()
    try:
        with courier.Client(impostor.address, token="secret", tls=TLS.load(ca_dir, HOST), timeout=3,
                            wait_for_ready=False) as client:
            with pytest.raises(courier.UnavailableError):
                client.echo("x")
    finally:
        impostor.stop(grace=0)


def test_the_environment_names_the_credentials_and_a_missing_file_says_how_to_make_it(ca_dir, tmp_path):
    assert from_environment({}) is None
    tls = from_environment({TLS_DIR_ENV: ca_dir, TLS_NAME_ENV: HOST})
    assert tls == TLS.load(ca_dir, HOST) and "PRIVATE" not in repr(tls)  # a repr never shows the key
    with pytest.raises(ValueError, match=TLS_NAME_ENV):
        from_environment({TLS_DIR_ENV: ca_dir})
    with pytest.raises(FileNotFoundError, match=r"python -m jaxdist.tools.certs .* --hosts m9"):
        TLS.load(ca_dir, "m9")


@pytest.mark.parametrize("arguments, error", [
    (["--hosts", "m0", "--days", "0"], "--days must be at least 1"),
    (["--hosts", ","], "--hosts takes host names or addresses separated by commas"),
])
def test_the_command_refuses_certificates_that_could_never_be_used(tmp_path, capsys, arguments, error):
    with pytest.raises(SystemExit) as exit_:
        certs.main([str(tmp_path / "run"), *arguments])
    assert exit_.value.code == 2 and error in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")


def test_the_command_says_which_directory_it_cannot_write_into(tmp_path, capsys):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as exit_:
        certs.main([str(blocked / "run"), "--hosts", "m0"])
    assert exit_.value.code == 2
    assert f"cannot write the certificates into {blocked / 'run'}: Not a directory" in capsys.readouterr().err


def plant_ca(directory, uid: int, mode: int) -> bytes:
    """A directory with someone else's CA in it, as another local user could leave it."""
    directory.mkdir()
    certs.make(str(directory), ["elsewhere"])
    for path in [directory, *directory.iterdir()]:
        os.chown(path, uid, uid)
    directory.chmod(mode)
    return (directory / "ca.pem").read_bytes()


@pytest.mark.parametrize("owner, mode", [("me", 0o777), ("another user", 0o755)])
def test_the_command_refuses_a_directory_others_could_have_written_and_keeps_no_ca_of_theirs(
        tmp_path, capsys, owner, mode):
    if owner != "me" and os.geteuid() != 0:
        pytest.skip("a directory of another user needs root (chown)")
    theirs = plant_ca(tmp_path / "shared", os.geteuid() if owner == "me" else 12345, mode)
    with pytest.raises(SystemExit) as exit_:
        certs.main([str(tmp_path / "shared"), "--hosts", "m0"])
    assert exit_.value.code == 2
    assert "not a directory of your own" in capsys.readouterr().err
    assert not (tmp_path / "shared" / "m0.key").exists() and (tmp_path / "shared" / "ca.pem").read_bytes() == theirs


def test_a_key_replaces_a_file_others_could_read_or_write(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    planted = directory / "m0.key"
    planted.write_text("")
    planted.chmod(0o666)
    certs.make(str(directory), ["m0"])
    assert stat.S_IMODE(os.stat(planted).st_mode) == 0o600
