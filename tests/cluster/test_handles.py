"""The worker groups have every member of the handles they implement, called the way the protocol says."""

import inspect

import pytest

from stratarl.cluster import handles
from stratarl.cluster.critic_group import CriticWorkerGroup
from stratarl.cluster.worker_group import PolicyWorkerGroup


def members(protocol: type) -> dict[str, object]:
    """The protocol's own and inherited members (properties and methods), by name."""
    found = {}
    for cls in reversed(protocol.__mro__):
        if cls is object or not getattr(cls, "_is_protocol", False) or cls.__module__ != handles.__name__:
            continue
        found |= {name: value for name, value in vars(cls).items() if not name.startswith("_")}
    return found


def parameters(function) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(
    ("protocol", "group"),
    [(handles.PolicyHandle, PolicyWorkerGroup), (handles.CriticHandle, CriticWorkerGroup)],
)
def test_a_group_implements_every_member_of_its_handle(protocol, group):
    expected = members(protocol)
    assert len(expected) == {handles.PolicyHandle: 20, handles.CriticHandle: 10}[protocol]
    for name, declared in expected.items():
        implemented = getattr(group, name, None)
        assert implemented is not None, f"{group.__name__} lacks {name}"
        if isinstance(declared, property):
            assert isinstance(implemented, property), name
        else:
            assert parameters(implemented) == parameters(declared), name


def test_the_narrow_protocols_cover_the_handle_once():
    """Each member of the policy's handle belongs to exactly one of its narrow protocols."""
    narrow = [handles.PolicyCompute, handles.PolicyWeights, handles.PolicyDataPath, handles.PolicyLifecycle]
    names = [name for protocol in narrow for name in members(protocol)]
    assert sorted(names) == sorted(members(handles.PolicyHandle))
