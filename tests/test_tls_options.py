"""The TLS options of the source, the sink and the CLI: what each needs, files checked when the
query is defined, the key's password never shown. (Connections: test_live_tls.py.)"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rmq_source.errors import RmqOptionError
from rmq_source.sink.options import parse_sink_options
from rmq_source.spark.options import parse_options
from tls_certs import make_certs

LIVE = {"namesrvAddr": "127.0.0.1:9876", "topic": "T"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("tls-opts"))


def test_tls_settings_reach_the_backend_spec_without_the_password(certs):
    from rmq_source.spark.query import open_backend
    opts = parse_options({**LIVE, "useTLS": "true", "tlsTrustCertPath": str(certs.ca),
                          "tlsCertPath": str(certs.server_cert), "tlsKeyPath": str(certs.server_key),
                          "tlsKeyPassword": "pw-s3cret", "tlsVerifyHostname": "false"}, streaming=False)
    tls = opts.tls
    assert (tls.trust_cert_path, tls.cert_path, tls.verify, tls.verify_hostname) == (
        str(certs.ca), str(certs.server_cert), True, False)
    assert open_backend(opts).spec.tls == tls
    for shown in (repr(opts), repr(tls), repr(open_backend(opts).spec)):
        assert "pw-s3cret" not in shown
    assert parse_options(LIVE, streaming=False).tls is None
    skip = parse_options({**LIVE, "useTLS": "true", "tlsSkipVerify": "true"}, streaming=False).tls
    assert (skip.verify, skip.verify_hostname) == (False, False)
    sink = parse_sink_options({"namesrvAddr": "h:1", "useTLS": "true", "tlsTrustCertPath": str(certs.ca)},
                              streaming=False)
    assert sink.tls.trust_cert_path == str(certs.ca)


@pytest.mark.parametrize("extra, words", [
    ({"tlsTrustCertPath": "{ca}"}, "option tlsTrustCertPath only applies with useTLS=true"),
    ({"useTLS": "yes"}, "option useTLS: invalid value 'yes'"),
    ({"useTLS": "true", "tlsSkipVerify": "true", "tlsTrustCertPath": "{ca}"},
     "option tlsTrustCertPath has no effect with tlsSkipVerify=true"),
    ({"useTLS": "true", "tlsKeyPath": "{key}"}, "option tlsKeyPath only applies with tlsCertPath"),
    ({"useTLS": "true", "tlsTrustCertPath": "{missing}"}, "is not a readable file"),
    ({"useTLS": "true", "tlsTrustCertPath": "{key}"}, "cannot be used for TLS"),     # not a CA
    ({"useTLS": "true", "tlsCertPath": "{cert}", "tlsKeyPath": "{other_key}"}, "cannot be used for TLS"),
])
def test_bad_tls_options_name_the_option(certs, tmp_path, extra, words):
    paths = {"ca": certs.ca, "key": certs.server_key, "cert": certs.server_cert,
             "other_key": certs.named_other_key, "missing": tmp_path / "nope.pem"}
    given = {k: v.format(**paths) for k, v in extra.items()}
    with pytest.raises(RmqOptionError, match=re.escape(words)):
        parse_options({**LIVE, **given}, streaming=False)


def test_tls_needs_a_live_cluster(tmp_path):
    with pytest.raises(RmqOptionError, match="option useTLS only applies with namesrvAddr"):
        parse_options({"storePath": str(tmp_path), "topic": "T", "useTLS": "true"}, streaming=False)


def test_a_wrong_password_is_an_error_that_does_not_show_it(certs, tmp_path):
    key = tmp_path / "enc.key"
    subprocess.run(["openssl", "pkey", "-in", str(certs.server_key), "-out", str(key), "-aes256",
                    "-passout", "pass:right-one"], check=True, capture_output=True, timeout=60)
    base = {**LIVE, "useTLS": "true", "tlsCertPath": str(certs.server_cert), "tlsKeyPath": str(key)}
    assert parse_options({**base, "tlsKeyPassword": "right-one"}, streaming=False).tls.key_path == str(key)
    with pytest.raises(RmqOptionError) as info:
        parse_options({**base, "tlsKeyPassword": "wrong-one"}, streaming=False)
    assert "cannot be used for TLS" in str(info.value) and "wrong-one" not in str(info.value)


def test_the_cli_flags_are_checked_like_the_options(certs, tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "rmq_source", *args], capture_output=True,
                              text=True, timeout=60)
    out = cli("topics", "--namesrv", "127.0.0.1:9", "--tls-trust-cert-path", str(certs.ca))
    assert out.returncode != 0 and "--tls-trust-cert-path only applies with --tls" in out.stderr
    out = cli("topics", str(tmp_path), "--tls")
    assert out.returncode != 0 and "--tls applies to --namesrv" in out.stderr
