"""The state of a multi-node group's rendezvous on its node rank 0, pure: who joined, which collective each pod
reached, which collectives every pod has completed.

A multi-node engine is one engine: its TP collectives span every pod of the group, as NCCL's do over the
group's torch.distributed world. The simulator's ranks meet in a `multiprocessing.Barrier` per pod; the
party that completes a pod's barrier then reports it here as "this pod reached collective `seq`, a
`kind`", and the pod's ranks are released only once every pod reached the same `seq` with the same `kind`.
So a pod whose local barrier never completes (one of its ranks in another collective, hung or dead) holds
every other pod's ranks in theirs, as a collective that one rank never enters holds the whole world.

Joining is torch.distributed's store rendezvous: every global rank says hello with what it believes the group
is (its name, node count, world size and, where it could see it, which pod is the leader), and the group is
formed once all `world` ranks joined. A hello that names another group, another shape or another leader pod
(a follower of a restarted group that reached the previous leader's process, still stopping at the same
name), or a rank that already joined, is refused: a follower never meets another group's, or another
generation's, leader.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hello:
    """What a rank says when it joins: the group it belongs to, as it sees it."""

    group: str
    nnodes: int
    world: int
    node_rank: int
    rank: int
    leader_uid: str | None = None  # the leader pod's uid as the rank resolved it; None when it could not tell

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Hello:
        """Raises ValueError for a hello with missing or mistyped fields."""
        try:
            uid = data.get("leader_uid")
            return cls(str(data["group"]), int(data["nnodes"]), int(data["world"]),  # type: ignore[call-overload]
                       int(data["node_rank"]), int(data["rank"]),  # type: ignore[call-overload]
                       str(uid) if uid else None)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a hello: {e!r}") from e


class Meeting:
    """One group's rendezvous, as its leader holds it. Not thread-safe: the server guards it with one lock."""

    def __init__(self, *, group: str, nnodes: int, world: int, leader_uid: str | None) -> None:
        if nnodes < 2 or world % nnodes:
            raise ValueError(f"a multi-node group needs nnodes >= 2 dividing world: {nnodes}, {world}")
        self.group = group
        self.nnodes = nnodes
        self.world = world
        self.leader_uid = leader_uid
        self.joined: set[int] = set()
        self._arrived: dict[int, dict[int, str]] = {}  # seq -> node rank -> collective kind
        self._released_through = 0  # every collective up to this seq completed on every pod

    @property
    def formed(self) -> bool:
        return len(self.joined) == self.world

    def refusal(self, hello: Hello) -> str | None:
        """Why `hello` may not join (None: it may)."""
        if hello.group != self.group:
            return f"this is group {self.group!r}, not {hello.group!r}"
        if (hello.nnodes, hello.world) != (self.nnodes, self.world):
            return (f"group {self.group!r} has {self.nnodes} node(s) and {self.world} rank(s), not {hello.nnodes} "
                    f"and {hello.world}")
        if hello.leader_uid and self.leader_uid and hello.leader_uid != self.leader_uid:
            return f"the leader here is pod {self.leader_uid}, not {hello.leader_uid}"
        per_node = self.world // self.nnodes
        if not 0 <= hello.rank < self.world or hello.rank // per_node != hello.node_rank:
            return f"rank {hello.rank} is not on node rank {hello.node_rank} of {self.nnodes}"
        if hello.rank in self.joined:
            return f"rank {hello.rank} already joined group {self.group!r}"
        return None

    def join(self, hello: Hello) -> str | None:
        """Joins `hello`'s rank unless refused; returns the refusal."""
        why = self.refusal(hello)
        if why is None:
            self.joined.add(hello.rank)
        return why

    def arrive(self, node_rank: int, seq: int, kind: str) -> None:
        """Node rank `node_rank`'s ranks all entered collective number `seq`, a `kind`. Each pod goes through its
        collectives in order, and reaches `seq + 1` only once `seq` was released, so releases are in order."""
        if seq <= self._released_through:
            return
        arrived = self._arrived.setdefault(seq, {})
        arrived[node_rank] = kind
        if len(arrived) == self.nnodes and len(set(arrived.values())) == 1 and seq == self._released_through + 1:
            self._released_through = seq
            del self._arrived[seq]

    def released(self, seq: int) -> bool:
        """Whether collective `seq` completed on every pod. Pods that reached it in different collectives never
        complete it: their ranks diverged, and stay where they are."""
        return seq <= self._released_through

    def waiting(self) -> dict[int, dict[int, str]]:
        """Collectives some pod reached that are not complete: seq -> node rank -> kind."""
        return {seq: dict(kinds) for seq, kinds in self._arrived.items()}
