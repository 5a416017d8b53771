"""The answers a group query gives to the questions brokers relay from operators' tools
(rmq_source.remote.running_info), without servers; mqadmin consumerStatus against real brokers:
test_live_group.py."""
from __future__ import annotations

import types

import pytest

from rmq_source.group.allocation import MessageQueue
from rmq_source.remote import fastjson
from rmq_source.remote.frames import RemotingCommand
from rmq_source.remote.running_info import MemberAnswers
from rmq_source.subscription import Subscription

A0, A1, R0 = MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1), MessageQueue("%RETRY%G", "broker-a", 0)


def _answers():
    session = types.SimpleNamespace(orderly=True, own_progress={A0: 7, R0: 0}, allocated={A0, A1, R0},
                                    locked_at_ms=1234, held_now=lambda: [A0])
    opts = types.SimpleNamespace(consumer_group="G", client_id="spark-1", namesrv_addrs=("127.0.0.1:9876",),
                                 allocate_strategy="AVG", consume_from_where="CONSUME_FROM_LAST_OFFSET",
                                 subscription=Subscription.parse("a || b"), topics=("T",))
    return MemberAnswers(session, opts)


def _ask(code, **fields):
    return _answers().serve(RemotingCommand(code, {k: str(v) for k, v in fields.items()}))


def test_running_info_is_the_java_clients_form():
    answer = _ask(307, consumerGroup="G", clientId="spark-1")
    assert answer.code == 0
    info = fastjson.loads(answer.body)
    table = {(dict(k)["topic"], dict(k)["queueId"]): v for k, v in info["mqTable"].items()}
    assert {k: (v["commitOffset"], v["locked"]) for k, v in table.items()} == {
        ("T", 0): (7, True), ("T", 1): (-1, False), ("%RETRY%G", 0): (0, False)}
    assert table[("T", 0)]["lastLockTimestamp"] == 1234
    subs = {s["topic"]: (s["subString"], sorted(s["tagsSet"])) for s in info["subscriptionSet"]}
    assert subs == {"T": ("a || b", ["a", "b"]), "%RETRY%G": ("*", [])}
    assert info["properties"]["clientId"] == "spark-1"
    assert info["properties"]["PROP_CONSUMEORDERLY"] == "true"
    assert set(info["statusTable"]) == {"T", "%RETRY%G"}


def test_consume_tps_is_the_messages_a_second_of_the_planned_micro_batches():
    from rmq_source.group.session import RateMeter
    answers = _answers()
    answers.session.planned = RateMeter(window_s=60)
    answers.session.planned.add({"T": 600, "%RETRY%G": 0})
    answers.session.planned.add({"T": 300})
    status = fastjson.loads(answers.running_info())["statusTable"]
    assert (status["T"]["consumeOKTPS"], status["T"]["pullTPS"]) == (15.0, 15.0)
    assert status["%RETRY%G"]["consumeOKTPS"] == 0.0


@pytest.mark.parametrize("code, fields, result, text", [
    (307, {"consumerGroup": "Other"}, 1, "The Consumer Group <Other> not exist in this consumer"),
    (309, {"consumerGroup": "G", "msgId": "x"}, 1, "micro-batches"),
    (221, {"group": "G", "topic": "T"}, 0, '"messageQueueTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:7}'),
    (40, {"consumerGroup": "G"}, None, None),            # oneway: nothing to answer
], ids=["other-group", "consume-directly", "status", "ids-changed"])
def test_the_other_questions(code, fields, result, text):
    answer = _ask(code, **fields)
    if result is None:
        assert answer is None
        return
    assert answer.code == result
    assert text in (answer.remark or answer.body.decode())


@pytest.mark.parametrize("group, body, noted", [
    ("G", b'{"offsetTable":{{"brokerName":"broker-a","queueId":1,"topic":"T"}:3,'
          b'{"brokerName":"broker-a","queueId":0,"topic":"T"}:0}}', {A0: 0, A1: 3}),
    ("Other", b'{"offsetTable":{{"brokerName":"broker-a","queueId":1,"topic":"T"}:3}}', None),
    ("G", b'{"offsetTable":[1,2]}', None),                 # unreadable: logged, nothing applied
], ids=["reset", "other-group", "unreadable"])
def test_a_reset_sent_by_a_broker_goes_to_the_session(group, body, noted, caplog):
    """RESET_CONSUMER_CLIENT_OFFSET (oneway, from ``mqadmin resetOffsetByTime`` on a 4.x broker):
    the offsets go to the session, whose next planning applies them."""
    answers = _answers()
    got = []
    answers.session.note_reset = lambda offsets, why: got.append((offsets, why))
    cmd = RemotingCommand(220, {"topic": "T", "group": group, "timestamp": "1700000000000",
                                "isForce": "true"}, body)
    assert answers.serve(cmd) is None
    if noted is None:
        assert got == []
        assert group != "G" or "could not be read" in caplog.text
    else:
        assert got == [(noted, "RESET_CONSUMER_CLIENT_OFFSET, timestamp 1700000000000")]
