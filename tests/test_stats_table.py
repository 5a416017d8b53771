"""The C reader of brokers' statistics answers (native/core/stats.c via
rmq_source.remote.stats_table) against the general parser (rmq_source.remote.fastjson): the same
numbers whenever it reads an answer, None (the general parser's turn) for any other form, never a
crash or an exception on hostile bytes. Real answers of both RocketMQ lines are read in
test_broker_remoting.py."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_source.remote import fastjson
from rmq_source.remote import requests as rq
from rmq_source.remote.stats_table import read_stats_table

FIELDS = ("maxOffset", "minOffset", "consumerOffset")


def _body(entries, *, space="", head='"consumeTps":0.0,', tail="") -> bytes:
    parts = [json.dumps(k, separators=(",", ":")) + space + ":" + space + json.dumps(v, separators=(",", ":"))
             for k, v in entries]
    return ("{" + head + '"offsetTable":{' + ",".join(parts) + "}" + tail + "}").encode()


def _full(body: bytes, topic: str, fields=FIELDS):
    """What the general parser reads, as read_stats_table answers; None where it must step aside."""
    try:
        table = fastjson.loads(body)["offsetTable"]
    except (ValueError, KeyError, TypeError):
        return None
    qids, columns = [], [[] for _ in fields]
    for key, value in table.items():
        key = dict(key) if isinstance(key, tuple) else None
        if (key is None or not isinstance(value, dict) or key.get("topic") != topic
                or type(key.get("queueId")) is not int or not -2**31 <= key["queueId"] < 2**31):
            return None
        qids.append(key["queueId"])
        for column, f in zip(columns, fields):
            v = value.get(f, 0)
            if type(v) is not int or not -2**63 <= v < 2**63:
                return None
            column.append(v)
    return qids, columns


_TOPICS = st.text(alphabet='aZ9_%|-"\\\u00e9}:{,', min_size=1, max_size=6)
_ANY = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**64, 2**64),
                              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                    max_leaves=6)
_VALUES = st.dictionaries(st.sampled_from([*FIELDS, "lastTimestamp", "x"]),
                          st.one_of(st.integers(-2**63, 2**63 - 1), _ANY), max_size=5)


@settings(max_examples=400, deadline=None)
@given(topic=_TOPICS, other=_TOPICS, values=st.lists(_VALUES, max_size=6), qids=st.lists(
           st.integers(-2**31 - 2, 2**31 + 1), min_size=6, max_size=6),
       space=st.sampled_from(["", " ", "\n"]), extra_key=st.sampled_from([None, "brokerName", "x"]),
       tail=st.sampled_from(["", ',"z":1', ',"z":{"a":[1,{"b":null}]}', ',"z":[{}]', ',"z":"}:{"']),
       foreign=st.booleans())
def test_what_the_c_reader_reads_is_what_the_general_parser_reads(
        topic, other, values, qids, space, extra_key, tail, foreign):
    entries = []
    for i, v in enumerate(values):
        key = {"queueId": qids[i], "topic": other if foreign and i == len(values) - 1 else topic}
        if extra_key:
            key[extra_key] = "broker-a"
        entries.append((dict(sorted(key.items())), v))
    body = _body(entries, space=space, tail=tail)
    got = _rows(read_stats_table(body, topic, FIELDS))
    want = _rows(_full(body, topic))
    if got is not None:               # (a queue id twice: the last entry counts, as in a dict)
        assert got == want
    plain = '"' not in topic and "\\" not in topic and not any(ord(ch) > 127 for ch in topic)
    if want is not None and plain and "\\" not in body.decode() and len(set(qids[:len(values)])) == len(values):
        assert got == want, body      # (the compact form without escapes: read by C)


def _rows(read):
    return None if read is None else dict(zip(read[0], zip(*read[1])))


def test_every_cut_and_every_changed_byte_is_read_right_or_left_to_the_general_parser():
    body = _body([({"brokerName": "b", "queueId": q, "topic": "T"},
                   {"consumerOffset": q * 3, "lastTimestamp": 17, "maxOffset": -q}) for q in range(4)],
                 tail=',"z":[1.5e3,true,null]')
    want = read_stats_table(body, "T", FIELDS)
    assert want == ([0, 1, 2, 3], [[0, -1, -2, -3], [0, 0, 0, 0], [0, 3, 6, 9]])
    for cut in range(len(body)):
        assert read_stats_table(body[:cut], "T", FIELDS) is None, cut
    for at in range(len(body)):
        for byte in (0, ord("{"), ord("}"), ord('"'), ord(":"), ord(","), ord("\\"), ord("9"), 0xFF):
            changed = body[:at] + bytes([byte]) + body[at + 1:]
            got = read_stats_table(changed, "T", FIELDS)
            assert got is None or got == _full(changed, "T"), (at, changed)


@pytest.mark.parametrize("body", [
    b"", b"{}", b"[]", b'{"offsetTable":[]}', b'{"offsetTable":{}} x',
    b'{"offsetTable":{},"offsetTable":{}}',                         # twice
    b'{"offsetTable":{{"queueId":1}:{}}}',                           # no topic
    b'{"offsetTable":{{"topic":"T"}:{}}}',                           # no queue id
    b'{"offsetTable":{{"queueId":1,"queueId":2,"topic":"T"}:{}}}',
    b'{"offsetTable":{{"queueId":1.0,"topic":"T"}:{}}}',
    b'{"offsetTable":{{"queueId":01,"topic":"T"}:{}}}',
    b'{"offsetTable":{{"queueId":2147483648,"topic":"T"}:{}}}',
    b'{"offsetTable":{{"queueId":1,"topic":"T"}:{"maxOffset":9223372036854775808}}}',
    b'{"offsetTable":{{"queueId":1,"topic":"T"}:{"maxOffset":1,"maxOffset":2}}}',
    b'{"offsetTable":{{"queueId":1,"topic":"T"}:{"maxOffset":"1"}}}',
    b'{"offsetTable":{{"queueId":1,"topic":"T\\u0041"}:{}}}',          # an escape in the topic
    b'{"offsetTable":{{"queueId":1,"topic":"T"}:{"x":' + b"[" * 70 + b"]" * 70 + b"}}}",   # too deep
])
def test_other_forms_are_left_to_the_general_parser(body):
    assert read_stats_table(body, "T", FIELDS) is None


def test_limits_of_the_numbers_and_an_empty_table():
    body = (b'{"offsetTable":{{"queueId":-2147483648,"topic":"T"}:{"maxOffset":-9223372036854775808},'
            b'{"queueId":2147483647,"topic":"T"}:{"maxOffset":9223372036854775807}}}')
    assert read_stats_table(body, "T", ("maxOffset",)) == ([-2**31, 2**31 - 1], [[-2**63, 2**63 - 1]])
    assert read_stats_table(b' { "offsetTable" : { } } ', "T", FIELDS) == ([], [[], [], []])
    with pytest.raises(TypeError):
        read_stats_table("{}", "T", FIELDS)
    with pytest.raises(TypeError):
        read_stats_table(b"{}", "T", ("",))


def test_a_foreign_entry_is_still_refused_by_the_general_parser():
    body = _body([({"queueId": 0, "topic": "T"}, {"maxOffset": 1}), ({"queueId": 1, "topic": "U"}, {})])
    assert read_stats_table(body, "T", FIELDS) is None
    with pytest.raises(Exception, match="unexpected statistics entry"):
        rq._stats_columns(body, "Q", "peer", "T", FIELDS)


@pytest.mark.parametrize("topic", ["", "T", "TopicOfALongerName"])
def test_the_most_entries_an_answer_can_hold_fit(topic):
    """Entries as short as the reader accepts, one after the other: all read, never too many
    for the room the wrapper makes."""
    entry = '{"queueId":0,"topic":"%s"}:{}' % topic
    body = ('{"offsetTable":{' + ",".join([entry] * 500) + "}}").encode()
    assert read_stats_table(body, topic, ("maxOffset",)) == ([0] * 500, [[0] * 500])
