"""The kubernetes backend's claim mode: an agent's sandbox claimed from a warm pool of
kubernetes-sigs/agent-sandbox (``[kubernetes] mode = "claim"``; its objects:
``kube_claim_spec``).

Lifecycle (calls go over pods/exec to the claimed pod, as in pod mode):

- what a process learned is kept for the next one in the data folder's
  ``kubernetes/`` (``kube_host.Notes``): the template and warm pool made at a
  size, their image's helpers checked; the agent's claim (or own Sandbox), its
  pod and the files written into it. A later process whose settings give the
  noted template and files goes straight to its exec on the noted pod, reading
  nothing first; that exec is the check. A pod that is gone (404), refuses the
  exec (being deleted, ended, not yet running) or is another made under the same
  name (the secrets file is not there: the loader stops before the command, and
  says so) ran nothing: the claim and the pod are then read (the same objects,
  by uid, ready, running, of that template), and a note that no longer holds is
  forgotten and learned anew before the exec is made again;
- a template not noted: the template and the warm pool are made when missing
  (the pool's size set to ``warm`` when it differs; a pool a server sizes,
  ``sized_by_server``, is left at its size: ``size_pool`` sets it);
- the agent's claim is made, or found again by name when there is one; a claim
  of another pool (the settings changed) is deleted and made anew. The call
  waits, on a watch of the claim from the version it made or read, until it
  holds a ready sandbox, then reads that sandbox's pod;
- on the claimed pod: the image's helpers are checked (a claim made now, once per
  template: its pods run one image), then
  one tar over exec writes the secrets file (0600, ``secrets_file``) and
  repos.json. Every command, the resident helper too, runs under
  ``loaded_argv``, which loads that file: no secret sits in a claim, a
  template or a sandbox object, nor on a command line;
- stop: the claim is deleted; its sandbox and pod go with it, the pool makes
  another. The home lived on the pod's emptyDir: it goes too;
- remove (``guilds sandbox rm``): stop, then the own Sandbox and its home
  volume, and the template and its warm pool when no other agent's claim or
  Sandbox is of that template (never a pool a server sizes); each named;
- ``keep_home``: the agent has a Sandbox of its own with its home on a volume
  claim; stop suspends it (the pod is deleted, the volume kept), the next call
  resumes it, and background commands of before read ``ended`` with their
  logs, which the state root on the volume kept;
- a claimed pod that ended (killed, evicted) fails that call, as in pod mode;
  its claim is deleted and the next call claims another (an own Sandbox is
  suspended and resumed, which makes its pod anew).

A pooled pod has no calls while it waits, so a claimed pod runs INIT without its
idle stop: ``guilds sandbox stop`` (or a claim's lifecycle set by the cluster's
operators) ends it. An own Sandbox's pod keeps the idle stop (``idle_minutes``):
INIT exits, the pod ends, and the next call suspends the Sandbox (the controller
deletes the ended pod) and resumes it, silently, as pod mode replaces an idle pod.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ...config.settings import AgentSettings
from ...errors import SandboxError
from ...limits import (
    CHANNEL_HELLO_SECONDS,
    KUBERNETES_CLAIM_GONE_SECONDS,
    KUBERNETES_CLAIM_POLL_SECONDS,
    KUBERNETES_CLAIM_WATCH_SLICE_SECONDS,
    KUBERNETES_START_SECONDS,
)
from .._container import blocking, helpers_digest, repos_file, repos_json
from ..base import Box, Check
from ..egress_side import Egress
from . import kube_admin as admin
from . import kube_claim_admin as claim_admin
from . import kube_claim_spec as claims
from . import kube_cluster as cluster
from . import kube_spec as spec
from .kube_egress import KubeEgress, PodSide, relay_of
from .kube_host import Notes, fingerprint_key
from .kube_pod import KubePodSandbox
from .kube_wire import Wire, WireError

if TYPE_CHECKING:
    from ..process_channel import KubeProcess

WATCH_SLICE_SECONDS = KUBERNETES_CLAIM_WATCH_SLICE_SECONDS
GONE_WAIT_SECONDS = KUBERNETES_CLAIM_GONE_SECONDS
SANDBOX_LABEL = "agents.x-k8s.io/sandbox-name-hash"
"""The label agent-sandbox's controller stamps on a Sandbox's pod, of that Sandbox alone:
what a claimed pod's egress policy selects it by (the pool's pods share every other)."""

CONTAINER_NOT_LISTED = "container not found"
"""The kubelet's answer to an exec in a pod whose container it does not list yet."""


class KubeClaimSandbox(KubePodSandbox):
    """``[kubernetes] mode = "claim"``: the pod of a Sandbox claimed from a warm pool of
    agent-sandbox (``keep_home``: of the agent's own Sandbox)."""

    network_list_held = ("on kubernetes only where the cluster enforces NetworkPolicy (each claimed pod is "
                         "checked before its first call and refused if not)")

    def __init__(self, settings: AgentSettings, data_dir: str | os.PathLike, *,
                 idle_seconds: float | None = None, api_client: Any = None):
        """data_dir: the data folder, where the notes of what was learned are kept
        (``kube_host``); api_client: a ``kubernetes.client.ApiClient`` (default: from the
        kubeconfig)."""
        super().__init__(settings, idle_seconds=idle_seconds, api_client=api_client,
                         loader=claims.loaded_argv(settings.id, []), wired=True)
        self.claim = spec.object_name(self.agent_id)
        self.keep_home = self.config.keep_home
        self.data_dir = data_dir
        self._note = Notes(data_dir, "agents", self.agent_id)
        self._held: dict[str, Any] = {}
        """The claim (or own Sandbox) as last seen ready."""
        self._may_trust = True
        """The agent's note may be taken as it says, unread (until an exec finds it stale)."""
        self._unverified = False
        """self.pod is the note's, taken unread: an exec that finds it gone or not set up
        raises PodGone (nothing ran), and the call looks again (``_in_pod``)."""
        self._claim_heard: list[Callable[[str, float], None]] = []
        self._claim_unheard: tuple[str, float] | None = None
        """The last claim made before any listener (``hear_claims``): its pool and seconds."""
        self._heard_lock = threading.Lock()
        self._claimed_at: float | None = None
        """When the claim being awaited was created (monotonic); None: none made now."""
        self._pod_read: dict[str, Any] | None = None
        """The claimed pod as last read (its labels and address: the egress policy's)."""
        self.egress = self._egress_of(data_dir)
        if self.egress is not None:
            self._base_env.update(self._pool_env(self.egress.env()))

    @classmethod
    def for_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike, *,
                  idle_seconds: float | None) -> KubeClaimSandbox:
        return cls(settings, data_dir, idle_seconds=idle_seconds)

    @classmethod
    def check(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, needed: bool) -> list[Check]:
        """The pod mode's line (the kubeconfig, the rights on pods), then agent-sandbox's."""
        lines = admin.check(settings, needed=needed)
        if all(line.ok for line in lines):
            lines += claim_admin.check(settings, needed=needed)
        return lines

    @classmethod
    def boxes(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, chosen: bool) -> list[Box]:
        """The pods so labelled in ``kubernetes.namespace`` and the agents' claims and own
        Sandboxes there, asked only when chosen."""
        return admin.boxes(settings) + claim_admin.listed(settings) if chosen else []

    async def remove(self) -> list[str]:
        """Stop, then delete the own Sandbox and its home volume, and the template and its
        warm pool when no other agent's claim or Sandbox is of it; each named."""
        gone = await self.stop()
        return gone + await blocking(self._remove_kept)

    def _remove_kept(self) -> list[str]:
        template = self._template_manifest()["metadata"]["name"]
        api, ns = self.core.api_client, self.config.namespace
        gone = list(claim_admin.remove(api, ns, self.claim))
        if self.config.sized_by_server:
            return gone  # the served template's pool: the server's, not this agent's
        unused = list(claim_admin.remove_unused_template(api, ns, template, removed=self.claim))
        if unused:
            Notes(self.data_dir, "templates", template).forget()
        return gone + unused

    # --- agent.network a list ------------------------------------------------------------
    def _egress_of(self, data_dir: str | os.PathLike) -> KubeEgress | None:
        """The egress of a claimed pod: its relay's file and trust bundle in the state root
        itself (the pool's pods start the relay before any agent claims one), its policy
        selecting the pod by its Sandbox's label."""
        if Egress.data_folder(self.settings, data_dir, self.name) is None:
            return None
        side = PodSide(lock=self._lock, ready=lambda: self._ready, apply_policy=self._apply_policy,
                       put=lambda files: self._put(files, making=True), run=self._run_quietly,
                       selector=self._pod_selector)
        return KubeEgress(self.settings, data_dir, pod=self.pod, idle_seconds=self.idle_seconds, side=side,
                          place="")

    def _pool_env(self, env: dict[str, str]) -> dict[str, str]:
        """What of the egress environment every agent of the template shares (the proxy's and
        the trust bundle's variables): the placeholders are the agent's, in its secrets file."""
        return {k: v for k, v in env.items() if k not in self.settings.secret_hosts}

    def _pod_selector(self) -> dict[str, str]:
        label = ((self._pod_read or {}).get("metadata") or {}).get("labels", {}).get(SANDBOX_LABEL)
        if not label:
            raise SandboxError(f"kubernetes: the claimed pod {self.pod} has no {SANDBOX_LABEL} label to hold its "
                               "egress policy to (agent-sandbox's controller sets it)")
        return {SANDBOX_LABEL: label}

    def _relay(self) -> claims.Relay:
        return None if self.egress is None else relay_of("")

    def _claimed_egress(self) -> bool:
        """agent.network a list, the claimed pod known (under the lock): the pod read, and
        its egress told of it (its proxy, policy, relay's file and trust bundle); False when
        the pod does not run (a noted one gone: the claim is read again)."""
        if self.egress is None:
            return True
        pod = self._read_pod() or {}
        if spec.pod_phase(pod)[0] != "running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return False
        self._pod_read = pod
        self.egress.pod = self.pod  # the claimed pod's name: its policy's, and its owner's
        self._egress_for_pod(pod)
        return True

    # --- what each mode says -------------------------------------------------------------
    def _start(self) -> None:
        self._ensure()

    def _stop(self) -> list[str]:
        """The claim given back (its sandbox and pod deleted), or the own Sandbox suspended."""
        with self._lock:
            self._ready = False
            self._note.forget()
            if self.egress is not None:
                self.egress.stop()
            if self.keep_home:
                self._set_mode("Suspended")
                return []
            return [f"claim {self.config.namespace}/{self.claim}"] if self._delete_claim(wait=False) else []

    def _pod_ended(self) -> None:
        """The pod ended: a claim is given back (the next call claims another); an own
        Sandbox is suspended (the next call resumes it with a new pod)."""
        self._note.forget()
        if self.keep_home:
            self._set_mode("Suspended")
        else:
            self._delete_claim(wait=False)

    def _ensure(self) -> bool:
        if self._ready:
            return False
        with self._lock, self._wire_kept():
            template = self._template()
            name = template["metadata"]["name"]
            files = self._files()
            digest = self._digest(files)
            if self._may_trust and self._noted_says(name, digest) and self._claimed_egress():
                self._ready = self._unverified = True
                return False
            self._unverified = False
            if self._noted_holds(name, digest):
                self._claimed_egress()
                self._ready = True
                return False
            self._note.forget()
            made = self._own_sandbox(template) if self.keep_home else self._claimed(template)
            pod = self._read_pod() or {}
            phase, detail = spec.pod_phase(pod)
            if phase in ("ended", "idle"):
                self._pod_ended()
                raise SandboxError(self._ended_text(detail or "it exited"))
            if phase != "running":
                self._wait_running()
                pod = self._read_pod() or {}
            if made:
                self._helpers_checked(name)
            self._put(files, making=True)
            self._noted(name, digest, pod)
            self._claimed_egress()
            self._ready = True
            self._claim_answered(name)
            return True

    # --- the notes of what was learned -----------------------------------------------------
    def _files(self) -> list[tuple[str, bytes, int]]:
        """The secrets file and repos.json, as the claimed pod gets them (agent.network a list:
        a host-bound secret's placeholder in place of its value, in both)."""
        egress = self.egress
        if egress is None:
            return [(claims.secrets_file(self.agent_id), claims.secrets_text(self.settings.secrets), 0o600),
                    (repos_file(self.agent_id), repos_json(self.settings, self.home), 0o600)]
        inside = {**egress.pod_secrets(), **{k: v for k, v in egress.env().items() if k in self.settings.secret_hosts}}
        return [(claims.secrets_file(self.agent_id), claims.secrets_text(inside), 0o600),
                (repos_file(self.agent_id), repos_json(self.settings, self.home, egress.repos_entries()), 0o600)]

    def _digest(self, files: list[tuple[str, bytes, int]]) -> str:
        """A keyed hash of the files (the note names what was written, and holds no secret)."""
        mac = hmac.new(fingerprint_key(self.data_dir), digestmod=hashlib.sha256)
        for name, data, mode in files:
            mac.update(f"{name}\0{mode}\0{len(data)}\0".encode() + data)
        return mac.hexdigest()[:32]

    def _noted_says(self, template: str, digest: str) -> bool:
        """The agent's note is of this template and these files, and names a pod: then
        self.pod is that pod, taken unread (``_unverified``)."""
        note = self._note.read()
        if note.get("template") != template or note.get("files") != digest or not isinstance(note.get("pod"), str):
            return False
        self.pod = note["pod"]
        return True

    def _gone(self) -> None:
        """The pod is gone, refused the exec or holds no secrets file: the note is forgotten,
        and the next start finds the claim and its pod and writes the files again."""
        self._may_trust = self._unverified = False
        self._note.forget()

    # --- execs on a pod taken from the note, unread ------------------------------------
    def _loaded(self, command: list[str], *, marking: bool = False) -> list[str]:
        return claims.loaded_argv(self.agent_id, command, marked=marking and self._unverified)

    @contextlib.contextmanager
    def _refused_as_gone(self) -> Iterator[None]:
        """An exec's handshake refused on a pod taken unread (being deleted, ended, not
        yet running), or on any pod whose container is not listed yet (a pod made anew
        under the claim's name): PodGone, so that the call looks again; it ran nothing."""
        try:
            yield
        except WireError as refused:
            if not self._unverified and CONTAINER_NOT_LISTED not in refused.body:
                raise
            raise cluster.PodGone(f"the pod {self.pod} refused the exec ({refused.status} {refused.reason})") \
                from refused

    def _open_ws(self, command: list[str]) -> Any:
        with self._refused_as_gone():
            return super()._open_ws(command)

    def _process_opened(self, process: KubeProcess) -> None:
        """On a pod taken unread: the loader's mark awaited; a loader that found no secrets
        file says the pod is another (made anew under the same name): PodGone."""
        if not self._unverified:
            return
        if process.read_to_mark(claims.LOADED_MARK, time.monotonic() + CHANNEL_HELLO_SECONDS):
            return
        # No mark: the loader ran nothing (no request was sent): whatever it said, not the pod noted.
        process.close()
        raise cluster.PodGone(f"the pod {self.pod} did not load the agent's secrets file: not the pod noted")

    def _exec(self, command: list[str], stdin: bytes, deadline: float) -> tuple[bytes, bytes, bytes, bool]:
        with self._refused_as_gone():
            out, err, status, complete = super()._exec(command, stdin, deadline)
        # On any pod, not only one taken unread: another thread of this process may have found
        # the note stale meanwhile, and a pod made anew under the claim's name has no file.
        if complete and claims.found_no_file(self.agent_id, spec.exit_status(status)[0], err):
            raise cluster.PodGone(f"the pod {self.pod} holds no secrets file: not the pod it was taken for")
        return out, err, status, complete

    def _noted_holds(self, template: str, digest: str) -> bool:
        """The agent's note still true: the same claim (or own Sandbox, running) by uid, bound
        to the same ready sandbox of this template, its pod the same by uid, running and not
        being deleted, the files of this digest written into it. Then self.pod is that pod."""
        note = self._note.read()
        if not note or note.get("template") != template or note.get("files") != digest:
            return False
        group, plural = (claims.GROUP, claims.SANDBOXES) if self.keep_home else (claims.EXTENSIONS, claims.CLAIMS)
        held = self._read(group, plural, self.claim)
        if held is None or held["metadata"].get("uid") != note.get("uid") or not self._holds_pod(held, note):
            return False
        pod = self._read_pod_named(note["pod"])
        meta = pod.get("metadata") or {}
        if meta.get("uid") != note.get("pod_uid") or meta.get("deletionTimestamp") \
                or spec.pod_phase(pod)[0] != "running":
            return False
        self.pod = note["pod"]
        return True

    def _holds_pod(self, held: dict[str, Any], note: dict[str, Any]) -> bool:
        if not self.keep_home:
            return bool(claims.bound_sandbox(held)) and claims.bound_sandbox(held) == note.get("sandbox")
        return (claims.condition(held, "Ready")[0] == "True" and claims.pod_of(held) == note.get("pod")
                and held["spec"].get("operatingMode") == "Running")

    def _noted(self, template: str, digest: str, pod: dict[str, Any]) -> None:
        """The agent's note: the claim (or own Sandbox) as last seen, its pod, the files."""
        held = self._held
        sandbox = claims.bound_sandbox(held) if not self.keep_home else self.claim
        self._note.write({"template": template, "files": digest, "uid": (held.get("metadata") or {}).get("uid"),
                          "sandbox": sandbox, "pod": self.pod, "pod_uid": (pod.get("metadata") or {}).get("uid")})

    def _helpers_checked(self, template: str) -> None:
        """The image's helpers checked once per template: every pod of it runs one image."""
        note = Notes(self.data_dir, "templates", template)
        if note.read().get("helpers"):
            return
        self._check_helpers()
        note.write({**note.read(), "helpers": True})

    # --- the template and its pool -----------------------------------------------------
    def _template_manifest(self) -> dict[str, Any]:
        return claims.template_manifest(self.config, home=self.home, network=self.settings.network,
                                        base_env=self._base_env, helpers=helpers_digest(),
                                        user=self.settings.user, relay=self._relay())

    def _template(self) -> dict[str, Any]:
        """The template the settings give, made with its pool at ``warm`` unless noted so (a pool
        a server sizes: unless noted made)."""
        template = self._template_manifest()
        note = Notes(self.data_dir, "templates", template["metadata"]["name"]).read()
        if "warm" not in note or (note["warm"] != self.config.warm and not self.config.sized_by_server):
            self._make_template(template)
        return template

    def _make_template(self, template: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
        """The template and its warm pool, made when missing; the pool set to replicas (None: to
        ``warm``, but a pool a server sizes is left at its size). The pool's status as read
        before it was set ({} when made now or not read)."""
        cfg, name = self.config, template["metadata"]["name"]
        wanted = cfg.warm if replicas is None else replicas
        self._create_custom(claims.EXTENSIONS, claims.TEMPLATES, template, "sandbox template")
        pool = claims.warm_pool_manifest(template, wanted)
        have: dict[str, Any] = {}
        if not self._create_custom(claims.EXTENSIONS, claims.POOLS, pool, "warm pool") and \
                (replicas is not None or not cfg.sized_by_server):
            have = self._read(claims.EXTENSIONS, claims.POOLS, name) or {}
            if (have.get("spec") or {}).get("replicas") != wanted:
                self._patch(claims.EXTENSIONS, claims.POOLS, name, {"spec": {"replicas": wanted}},
                            "resize the warm pool")
        note = Notes(self.data_dir, "templates", name)
        note.write({**note.read(), "warm": wanted})
        return dict(have.get("status") or {})

    async def size_pool(self, replicas: int) -> tuple[str, dict[str, Any]]:
        """Set the warm pool of these settings' template to replicas, the template and the pool made
        when missing (a server sizing a served template's pool: ``guilds.agents.claim_pools``); the
        pool's name and its status as read just before (``readyReplicas``, ``replicas``; {} when
        made now)."""
        return await blocking(self._size_pool, replicas)

    def _size_pool(self, replicas: int) -> tuple[str, dict[str, Any]]:
        with self._wire_kept():
            template = self._template_manifest()
            status = self._make_template(template, replicas)
            return str(template["metadata"]["name"]), status

    # --- a claim from the pool ---------------------------------------------------------
    def _claimed(self, template: dict[str, Any]) -> bool:
        """Find or make the agent's claim, wait until it holds a ready sandbox and point
        self.pod at that sandbox's pod; True when the claim was made now."""
        pool = template["metadata"]["name"]
        self._claimed_at = time.monotonic()
        claim = self._create_claim(pool)
        made = claim is not None
        if claim is None:  # there is one: of this pool, or of another (the settings changed)
            claim = self._read(claims.EXTENSIONS, claims.CLAIMS, self.claim)
            if claim is not None and claims.pool_of(claim) != pool:
                self._delete_claim(wait=True)
                self._claimed_at = time.monotonic()
                claim = self._create_claim(pool)
                made = claim is not None
        if not made:
            self._claimed_at = None
        self._held = self._wait_bound(template, claim)
        bound = claims.bound_sandbox(self._held)
        sandbox = self._read(claims.GROUP, claims.SANDBOXES, bound)
        self.pod = claims.pod_of(sandbox) if sandbox is not None else bound
        return made

    def hear_claims(self, heard: Callable[[str, float], None]) -> None:
        """Tell heard, for each claim this sandbox makes (and the last one made before any was heard),
        its warm pool's name and the seconds from the claim's create to its pod's first answer,
        its files written (``guilds.observe.metrics``); heard may be called from a worker thread."""
        with self._heard_lock:
            if heard in self._claim_heard:
                return
            self._claim_heard.append(heard)
            unheard, self._claim_unheard = self._claim_unheard, None
        if unheard is not None:
            heard(*unheard)

    def _claim_answered(self, pool: str) -> None:
        """A claim made now has its pod answering: tell those who hear claims how long that took."""
        made_at, self._claimed_at = self._claimed_at, None
        if made_at is None:
            return
        seconds = time.monotonic() - made_at
        with self._heard_lock:
            listeners = list(self._claim_heard)
            if not listeners:
                self._claim_unheard = (pool, seconds)
        for heard in listeners:
            heard(pool, seconds)

    def _create_claim(self, pool: str) -> dict[str, Any] | None:
        """The agent's claim on pool, as made now; None when there was one."""
        manifest = claims.claim_manifest(self.config.namespace, self.agent_id, pool)
        with self._api("create the claim"), cluster.ignoring(409):
            return self._wired_to().request("POST", self._objects(claims.EXTENSIONS, claims.CLAIMS), manifest)
        return None

    def _wait_bound(self, template: dict[str, Any], claim: dict[str, Any] | None) -> dict[str, Any]:
        """The claim once it holds a ready sandbox: claim (as made or read just now; None:
        read it), then watched until it does (the watch's event is the claim as it is then),
        read again after each watch. A claim whose template or pool is not found (deleted
        after it was noted) has them made again, once."""
        deadline = time.monotonic() + KUBERNETES_START_SECONDS
        detail, remade = "", False
        while time.monotonic() < deadline:
            if claim is None:
                claim = self._read(claims.EXTENSIONS, claims.CLAIMS, self.claim)
            if claim is None:
                raise SandboxError(f"kubernetes: the claim {self.claim} was deleted while it was awaited")
            if claims.bound_sandbox(claim):
                return claim
            detail = claims.condition(claim, "Ready")[1] or detail
            if "NotFound" in detail and not remade:
                self._make_template(template)
                remade = True
            seconds = max(1, min(WATCH_SLICE_SECONDS, int(deadline - time.monotonic())))
            path = (f"{self._objects(claims.EXTENSIONS, claims.CLAIMS)}?fieldSelector=metadata.name%3D{self.claim}"
                    f"&resourceVersion={claim['metadata']['resourceVersion']}")
            with self._api(f"watch the claim {self.claim}"), \
                    contextlib.closing(self._wired_to().watch(path, seconds)) as events:
                for event in events:
                    got = event.get("object") or {}
                    detail = claims.condition(got, "Ready")[1] or detail
                    if event.get("type") != "DELETED" and claims.bound_sandbox(got):
                        return dict(got)
                    if event.get("type") == "DELETED" or \
                            ("NotFound" in detail and not remade):
                        break
            claim = None
        raise SandboxError(f"kubernetes: the claim {self.claim} held no ready sandbox after "
                           f"{KUBERNETES_START_SECONDS} s ({detail or 'no condition yet'}); is the "
                           "agent-sandbox controller running with --extensions?")

    def _delete_claim(self, *, wait: bool) -> bool:
        """Delete the claim (wait: until it is gone); True when there was one."""
        deleted = False
        with self._api("delete the claim"), cluster.ignoring(404):
            self._wired_to().request("DELETE", f"{self._objects(claims.EXTENSIONS, claims.CLAIMS)}/{self.claim}")
            deleted = True
        deadline = time.monotonic() + GONE_WAIT_SECONDS
        while wait and self._read(claims.EXTENSIONS, claims.CLAIMS, self.claim) is not None:
            if time.monotonic() > deadline:
                raise SandboxError(f"kubernetes: the claim {self.claim} was not gone after {GONE_WAIT_SECONDS} s")
            time.sleep(KUBERNETES_CLAIM_POLL_SECONDS)
        return deleted

    # --- an agent's own Sandbox (keep_home) --------------------------------------------
    def _own_sandbox(self, template: dict[str, Any]) -> bool:
        """Make the agent's Sandbox, or resume it when suspended; wait until it is ready."""
        wanted = claims.own_sandbox_manifest(self.config, template, self.agent_id, self.idle_seconds,
                                             relay=self._relay())
        have = self._read(claims.GROUP, claims.SANDBOXES, self.claim)
        if have is not None and have["spec"].get("podTemplate") != wanted["spec"]["podTemplate"]:
            self._patch(claims.GROUP, claims.SANDBOXES, self.claim,  # the settings changed: the next pod is new
                        {"spec": {"podTemplate": wanted["spec"]["podTemplate"]}}, "update the sandbox")
        made = have is None and self._create_custom(claims.GROUP, claims.SANDBOXES, wanted, "sandbox")
        if have is not None and have["spec"].get("operatingMode") == "Suspended":
            self._set_mode("Running")
        elif have is not None and spec.pod_phase(self._read_pod_named(claims.pod_of(have)))[0] == "idle":
            self._resume_after_idle(claims.pod_of(have))
        deadline = time.monotonic() + KUBERNETES_START_SECONDS
        detail = ""
        while time.monotonic() < deadline:
            sandbox = self._read(claims.GROUP, claims.SANDBOXES, self.claim)
            if sandbox is not None:
                status, detail = claims.condition(sandbox, "Ready")
                if status == "True":
                    self.pod, self._held = claims.pod_of(sandbox), sandbox
                    return made
            time.sleep(KUBERNETES_CLAIM_POLL_SECONDS)
        raise SandboxError(f"kubernetes: the sandbox {self.claim} was not ready after "
                           f"{KUBERNETES_START_SECONDS} s ({detail or 'no condition yet'})")

    def _resume_after_idle(self, pod: str) -> None:
        """The idle stop ended the pod (INIT exited 0): suspend the Sandbox, wait until the
        controller has deleted that pod, and resume it (a new pod on the same volume)."""
        self._set_mode("Suspended")
        deadline = time.monotonic() + GONE_WAIT_SECONDS
        while self._read_pod_named(pod):
            if time.monotonic() > deadline:
                raise SandboxError(f"kubernetes: the idle pod {pod} was not gone after {GONE_WAIT_SECONDS} s")
            time.sleep(KUBERNETES_CLAIM_POLL_SECONDS)
        self._set_mode("Running")

    def _read_pod_named(self, pod: str) -> dict[str, Any]:
        return self._get(self._wired_to(), f"/api/v1/namespaces/{self.config.namespace}/pods/{pod}", "read the pod") \
            or {}

    def _set_mode(self, mode: str) -> None:
        self._patch(claims.GROUP, claims.SANDBOXES, self.claim, claims.operating_mode(mode),
                    f"set the sandbox {self.claim} {mode.lower()}", missing_ok=True)

    # --- the cluster's custom objects, through the wire ----------------------------------
    def _wire_kept(self) -> contextlib.AbstractContextManager[None]:
        """The requests of a start on one connection (``Wire.kept``)."""
        return self.wire.kept() if self.wire is not None else contextlib.nullcontext()

    def _wired_to(self) -> Wire:
        wire = self.wire
        if wire is None:
            raise SandboxError("kubernetes: the claim mode has no way to the API server")
        return wire

    def _objects(self, group: str, plural: str) -> str:
        return f"/apis/{group}/{claims.VERSION}/namespaces/{self.config.namespace}/{plural}"

    def _read(self, group: str, plural: str, name: str) -> dict[str, Any] | None:
        return self._get(self._wired_to(), f"{self._objects(group, plural)}/{name}", f"read the {plural[:-1]} {name}")

    def _create_custom(self, group: str, plural: str, body: dict[str, Any], what: str) -> bool:
        """Create body; False when it was there already (409)."""
        with self._api(f"create the {what}"), cluster.ignoring(409):
            self._wired_to().request("POST", self._objects(group, plural), body)
            return True
        return False

    def _patch(self, group: str, plural: str, name: str, patch: dict[str, Any], what: str, *,
               missing_ok: bool = False) -> None:
        """A merge patch of the object (missing_ok: none when it is not there)."""
        with self._api(what), cluster.ignoring(404 if missing_ok else -1):
            self._wired_to().request("PATCH", f"{self._objects(group, plural)}/{name}", patch,
                                     content_type="application/merge-patch+json")
