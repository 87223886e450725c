"""A three-node NATS cluster with JetStream on loopback, for fault injection (kill the stream leader)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import nats.js.errors

from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.embedded import NatsServer, free_port
from commonos.runtime.nats import ensure_streams


@dataclass
class NatsCluster:
    root: Path
    size: int = 3
    nodes: list[NatsServer] = field(default_factory=list)

    def start(self) -> NatsCluster:
        client_ports = [free_port() for _ in range(self.size)]
        cluster_ports = [free_port() for _ in range(self.size)]
        for i in range(self.size):
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i)
            conf = self.root / f"n{i}.conf"
            conf.write_text(
                f'server_name: "n{i}"\n'
                f"jetstream {{ max_mem_store: 256MB, max_file_store: 4GB }}\n"
                f'cluster {{ name: "cos", listen: "127.0.0.1:{cluster_ports[i]}", routes: [{routes}] }}\n'
            )
            self.nodes.append(
                NatsServer(self.root / f"n{i}", port=client_ports[i], config_file=conf, name=f"nats-n{i}")
            )
        for node in self.nodes:
            node.start()
        return self

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def node(self, server_name: str) -> NatsServer:
        return self.nodes[int(server_name.removeprefix("n"))]

    async def ready(self, replicas: int = 3, timeout_s: float = 60.0) -> None:
        """Until JetStream has a meta leader and the streams exist at `replicas`."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                nc = await nats.connect(servers=self.urls, connect_timeout=2)
                try:
                    await ensure_streams(nc.jetstream(timeout=5), replicas)
                    info = await nc.jetstream().stream_info(EVENTS_STREAM)
                    if info.cluster is not None and info.cluster.leader:
                        return
                finally:
                    await nc.close()
            except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                last = exc
            await asyncio.sleep(0.5)
        raise AssertionError(f"the NATS cluster did not become ready in {timeout_s}s: {last!r}")

    async def stream_leader(self) -> str:
        nc = await nats.connect(servers=self.urls)
        try:
            info = await nc.jetstream().stream_info(EVENTS_STREAM)
            assert info.cluster is not None and info.cluster.leader
            return info.cluster.leader
        finally:
            await nc.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
