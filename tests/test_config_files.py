"""config_files: fastjson parsing, the broker's load fallback, atomic writes, offsets and topics."""
from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from conftest import fixture_dir

from rmq_source.store.config_files import (dump_fastjson, load_config_json, parse_fastjson,
                                           read_consumer_offsets, read_topics, write_config_atomic)
from rmq_source.errors import RmqConfigFileError, RmqSourceError


def need_fixture() -> Path:
    return fixture_dir("rocketmq-4.9.3/basic")


# ------------------------------------------------------------------------------------ parsing

@pytest.mark.parametrize("text, expected", [
    ('{"a":{0:1,1:2}}', {"a": {0: 1, 1: 2}}),
    ('{\n\t"a":{0:1,1:2\n\t}\n}', {"a": {0: 1, 1: 2}}),
    ('{ -1 : 5 , 12:-7}', {-1: 5, 12: -7}),
    ('{"0":1}', {"0": 1}),                               # quoted keys stay strings
    ('{"s":",12:x{3:"}', {"s": ",12:x{3:"}),             # look-alikes inside strings untouched
    ('{"s":"a\\"b,1:2"}', {"s": 'a"b,1:2'}),             # escaped quotes inside strings
    ('{"l":[1,2,{3:4}]}', {"l": [1, 2, {3: 4}]}),
    ('{"big":{0:9223372036854775807}}', {"big": {0: 9223372036854775807}}),
    ('{}', {}),
    ('{"名前":{7:1}}', {"名前": {7: 1}}),
])
def test_parse_fastjson(text, expected):
    assert parse_fastjson(text) == expected


@pytest.mark.parametrize("text", ['{"a":{0:1', '{0:}', '', 'nope', '{"a":1}}', '{"a":{0:1,}}'])
def test_parse_fastjson_rejects_broken_text(text):
    with pytest.raises(ValueError):
        parse_fastjson(text)


@pytest.mark.parametrize("obj", [
    {"offsetTable": {"T@G": {0: 317, 1: 142}, "%RETRY%G@G": {0: 0}}},
    {"offsetTable": {}},
    {"dataVersion": {"counter": 2, "timestamp": 1}, "topicConfigTable": {
        "T": {"order": False, "perm": 6, "readQueueNums": 4, "topicName": "T", "attributes": {}}}},
    {"l": [1, "x", None, True, {"k": [1]}], "e": [], "u": "ü\n\"q\""},
    {"mixed": {"a": 1, 2: 3}},
])
def test_dump_then_parse_round_trips(obj):
    assert parse_fastjson(dump_fastjson(obj)) == obj


def test_dump_writes_broker_shape_for_integer_keyed_maps():
    text = dump_fastjson({"offsetTable": {"TopicTest@ConsumerGroupA": {0: 317, 1: 142}}})
    assert text == ('{\n\t"offsetTable":{\n\t\t"TopicTest@ConsumerGroupA":{0:317,1:142\n\t\t}'
                    '\n\t}\n}')


def test_dump_reproduces_the_brokers_consumer_offset_file():
    root = need_fixture()
    text = (root / "store" / "config" / "consumerOffset.json").read_text()
    assert dump_fastjson(parse_fastjson(text)) == text


@pytest.mark.parametrize("bad", [{1.5: 1}, {None: 1}, {"a": object()}, {"a": float("nan")}])
def test_dump_rejects_what_json_cannot_hold(bad):
    with pytest.raises((TypeError, ValueError)):
        dump_fastjson(bad)


# ------------------------------------------------------------------------- broker's fixture

def test_consumer_offsets_match_the_brokers_own_reading():
    root = need_fixture()
    readback = json.loads((root / "offsets_readback.json").read_text())
    expected = {}
    for key, queues in readback["offsetTable"].items():
        topic, group = key.split("@")
        expected[(topic, group)] = {int(q): off for q, off in queues.items()}
    assert read_consumer_offsets(root / "store") == expected


def test_topics_of_the_fixture():
    root = need_fixture()
    topics = read_topics(root / "store")
    assert topics["TopicTest"]["readQueueNums"] == 4
    assert topics["OrderTopic"]["writeQueueNums"] == 8
    assert topics["SCHEDULE_TOPIC_XXXX"]["readQueueNums"] == 18


# ------------------------------------------------------------------------------------ fallback

@pytest.fixture
def config_copy(tmp_path):
    root = need_fixture()
    store = tmp_path / "store"
    shutil.copytree(root / "store" / "config", store / "config")
    for f in (store / "config").iterdir():
        f.chmod(0o644)
    return store


BAK_OFFSETS = {("TopicTest", "ConsumerGroupA"): {0: 105, 1: 95, 2: 97, 3: 106},
               ("OrderTopic", "ConsumerGroupB"): {0: 37, 1: 34, 2: 39, 3: 26, 4: 34, 5: 31, 6: 30,
                                                  7: 28}}


@pytest.mark.parametrize("damage", [
    "missing", "empty", "whitespace", "torn", "not_utf8",
])
def test_damaged_main_file_falls_back_to_bak(config_copy, damage):
    main = config_copy / "config" / "consumerOffset.json"
    text = main.read_bytes()
    if damage == "missing":
        main.unlink()
    elif damage == "empty":
        main.write_bytes(b"")
    elif damage == "whitespace":
        main.write_bytes(b" \n\t")
    elif damage == "torn":
        main.write_bytes(text[: len(text) // 2])
    elif damage == "not_utf8":
        main.write_bytes(b"\xff\xfe" + text)
    assert read_consumer_offsets(config_copy) == BAK_OFFSETS


def test_missing_main_prefers_tmp_over_bak(config_copy):
    """4.9.3 deletes the main file before renaming .tmp over it: .tmp is then the newest version."""
    main = config_copy / "config" / "consumerOffset.json"
    tmp = main.with_name(main.name + ".tmp")
    tmp.write_text('{"offsetTable":{"T@G":{0:5}}}')
    main.unlink()
    assert read_consumer_offsets(config_copy) == {("T", "G"): {0: 5}}


def test_readable_main_wins_over_stale_tmp(config_copy):
    main = config_copy / "config" / "consumerOffset.json"
    main.with_name(main.name + ".tmp").write_text('{"offsetTable":{"T@G":{0:5}}}')
    assert read_consumer_offsets(config_copy)[("TopicTest", "ConsumerGroupA")][0] == 317


def test_all_candidates_bad_raises_naming_every_file(config_copy):
    main = config_copy / "config" / "consumerOffset.json"
    main.write_text('{"offsetTable":{')
    main.with_name(main.name + ".bak").write_text("garbage")
    with pytest.raises(RmqConfigFileError) as info:
        read_consumer_offsets(config_copy)
    message = str(info.value)
    assert "consumerOffset.json:" in message and "consumerOffset.json.bak:" in message
    assert isinstance(info.value, RmqSourceError) and isinstance(info.value, ValueError)


def test_no_files_at_all(tmp_path):
    assert load_config_json(tmp_path / "config" / "x.json") is None
    assert read_consumer_offsets(tmp_path) == {}
    assert read_topics(tmp_path) == {}


def test_empty_main_and_no_bak_is_empty_like_the_broker(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "consumerOffset.json").write_text("")
    assert read_consumer_offsets(tmp_path) == {}


@pytest.mark.parametrize("content, fragment", [
    ('{"offsetTable":[]}', "not an object"),
    ('{"offsetTable":{"TopicOnly":{0:1}}}', "topic@group"),
    ('{"offsetTable":{"@G":{0:1}}}', "empty topic"),
    ('{"offsetTable":{"T@G":{0:"x"}}}', "integer"),
    ('{"offsetTable":{"T@G":{"q":1}}}', "queue id"),
    ('{"offsetTable":{"T@G":5}}', "not an object"),
    # offsets that no queue can have: named with the file, the entry and the valid range
    ('{"offsetTable":{"T@G":{0:%d}}}' % 2 ** 70, r"consumerOffset\.json: 'T@G' queue 0 has offset "
     r"1180591620717411303424, which is not a queue offset: expected an integer in \[0, "
     r"461168601842738790\]"),
    ('{"offsetTable":{"T@G":{3:%d}}}' % (2 ** 63 - 1), r"queue 3 has offset 9223372036854775807"),
    ('{"offsetTable":{"T@G":{0:%d}}}' % ((2 ** 63 - 1) // 20 + 1), "not a queue offset"),
    ('{"offsetTable":{"T@G":{0:-5}}}', r"queue 0 has offset -5, which is not a queue offset"),
])
def test_malformed_offset_tables_are_errors(tmp_path, content, fragment):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "consumerOffset.json").write_text(content)
    with pytest.raises(RmqConfigFileError, match=fragment):
        read_consumer_offsets(tmp_path)


def test_split_on_first_at_and_string_queue_ids(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "consumerOffset.json").write_text(
        '{"dataVersion":{"counter":1},"groupTopicMap":{},'
        '"offsetTable":{"%RETRY%G@G":{0:3},"T@G":{"1":4}}}')
    assert read_consumer_offsets(tmp_path) == {("%RETRY%G", "G"): {0: 3}, ("T", "G"): {1: 4}}


# -------------------------------------------------------------------------------- atomic write

def test_write_config_atomic_keeps_previous_version_as_bak(tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    write_config_atomic(path, '{"v":1}')
    assert path.read_text() == '{"v":1}'
    assert not path.with_name(path.name + ".bak").exists()
    write_config_atomic(path, '{"v":"second ü"}')
    assert path.read_text(encoding="utf-8") == '{"v":"second ü"}'
    assert path.with_name(path.name + ".bak").read_text() == '{"v":1}'
    assert sorted(p.name for p in path.parent.iterdir()) == ["consumerOffset.json",
                                                            "consumerOffset.json.bak"]


def test_torn_main_file_does_not_replace_a_good_bak(tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    write_config_atomic(path, '{"v":1}')
    write_config_atomic(path, '{"v":2}')
    path.write_text('{"v":')                         # e.g. a 5.3.3 broker died mid-write
    write_config_atomic(path, '{"v":3}')
    assert path.with_name(path.name + ".bak").read_text() == '{"v":1}'
    assert load_config_json(path) == {"v": 3}


def test_write_config_atomic_rejects_non_text(tmp_path):
    with pytest.raises(TypeError):
        write_config_atomic(tmp_path / "x.json", b"bytes")


def test_concurrent_atomic_writes_never_expose_a_torn_file(tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    docs = [dump_fastjson({"offsetTable": {f"T@G{i}": {q: q * i for q in range(200)}}})
            for i in range(4)]
    write_config_atomic(path, docs[0])
    stop = threading.Event()
    seen_bad = []

    def reader():
        while not stop.is_set():
            text = path.read_text()
            if text not in docs:
                seen_bad.append(text)

    def writer(doc):
        for _ in range(40):
            write_config_atomic(path, doc)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(d,)) for d in docs]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not seen_bad
    assert parse_fastjson(path.with_name(path.name + ".bak").read_text())
    assert not [p for p in os.listdir(path.parent) if p.endswith(".tmp")]
