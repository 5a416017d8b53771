"""User allocation strategies that tests load through create_strategy("alloc_user_strategy:Class")."""
from __future__ import annotations

from rmq_source.group.allocation import MessageQueue


class EveryNth:
    """Gives the consumer at index i of cid_all the queues i, i + step, ... (a user's own rule)."""

    name = "EVERY_NTH"

    def __init__(self, step: int = 1):
        self.step = step

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        return list(mq_all[cid_all.index(current_cid)::self.step])


class Failing:
    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        raise KeyError("user strategy bug")


class ReturnsTuple:
    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        return tuple(mq_all)


class ReturnsForeignQueue:
    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        return [MessageQueue("OtherTopic", "broker-z", 0)]


class ReturnsStrings:
    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        return [str(mq) for mq in mq_all]


class NoAllocate:
    name = "NO_ALLOCATE"


class BrokenInit:
    def __init__(self):
        raise RuntimeError("cannot start")

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        return []


class Resolver:
    """Machine room = last character of the broker name / client id (not RocketMQ's rule)."""

    def broker_deploy_in(self, mq):
        return mq.broker_name[-1]

    def consumer_deploy_in(self, cid):
        return cid[-1]


class Fickle:
    """Answers differently in alternate rounds (a round starts when the first consumer of cid_all is
    asked): all queues to the first consumer, then none to anyone."""

    name = "FICKLE"

    def __init__(self):
        self.rounds = 0

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        if current_cid == cid_all[0]:
            self.rounds += 1
            return list(mq_all) if self.rounds % 2 else []
        return []
