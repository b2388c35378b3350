"""Checks the rendered Kubernetes manifests offline (run by check.sh, in its venv).

usage: check.py K8S_VERSION REPO_ROOT NAME=RENDERED.yaml ...

NAME is the overlay (and components) a file was rendered from: "cpu-only", "gpu", or one of
those followed by "+component" for each component added ("cpu-only+autoscale-keda").

Every object is validated against the Kubernetes API schemas of K8S_VERSION (strict: unknown
fields are errors) with kubernetes-validate. The custom resources (KEDA's ScaledObject,
prometheus-operator's ServiceMonitor) have no schema there: their fields are checked here
against the fields those CRDs define, and their references against the other objects. Then
come the checks of what the manifests mean for Flotilla: the flags exist (docs/cli.md, made
from the program), the metric the autoscaler queries exists (the coordinator's http.rs), the
selectors select, the ports resolve (the coordinator's gang rendezvous at a fixed port, exposed
by its Service, open to the workers in its NetworkPolicy), the worker's grace fits the pod's,
and each overlay holds what it should.
"""

import re
import sys
from pathlib import Path

import kubernetes_validate
import yaml

NAMESPACE = "flotilla"
ADMIN_SECRET = "flotilla-admin-token"
WORKER_SECRET = "flotilla-worker-token"
TLS_SECRET = "flotilla-tls"  # components/tls: tls.crt, tls.key, ca.crt
METRICS_SECRET = "flotilla-metrics-token"
STATE_DIR = "/var/lib/flotilla"
# The worker waits --grace + this long for its tasks after it is asked to leave (worker.rs).
WORKER_LEAVE_SLACK_S = 15
# What the pod's grace period keeps beyond that, for the checkpoints' upload and the exit.
WORKER_LEAVE_MARGIN_S = 10
NON_NAMESPACED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}

results = []  # (ok, text)


def check(ok, text):
    results.append((bool(ok), text))
    print(("ok    " if ok else "FAIL  ") + text)
    return bool(ok)


# --- what the program says ---------------------------------------------------------------


def cli_flags(repo):
    """Flags per command from docs/cli.md ("## flotilla server" -> "server")."""
    text = (repo / "docs" / "cli.md").read_text()
    flags, section = {}, None
    for line in text.splitlines():
        m = re.match(r"^## flotilla(?: (.*))?$", line)
        if m:
            section = m.group(1) or ""
            flags.setdefault(section, set())
            continue
        if section is not None:
            for f in re.findall(r"`(--[a-z0-9-]+)", line):
                if line.startswith("| `--"):
                    flags[section].add(f)
    return flags


def metric_names(repo):
    """The metrics the coordinator exports (registered with the prefix flotilla_)."""
    src = (repo / "crates" / "flotilla-cluster" / "src" / "server" / "http.rs").read_text()
    names = {"flotilla_" + n for n in re.findall(r'r\.register\(\s*"([a-z_]+)"', src)}
    # The values of flotilla_tasks{state}: the TASK_STATES array.
    m = re.search(r"const TASK_STATES: \[&str; \d+\] = \[(.*?)\];", src, re.S)
    states = set(re.findall(r'"([a-z]+)"', m.group(1))) if m else set()
    return names, states


# --- helpers -----------------------------------------------------------------------------


def labels_match(selector, labels):
    ml = (selector or {}).get("matchLabels", {}) or {}
    if (selector or {}).get("matchExpressions"):
        raise ValueError("matchExpressions are not evaluated by this check")
    return all(labels.get(k) == v for k, v in ml.items())


def pod_templates(objs):
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield o, o["spec"]["template"]


def container_env(c):
    return {e["name"]: e for e in c.get("env", []) or []}


def flag_values(args, flag):
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag] + [
        a.split("=", 1)[1] for a in args if a.startswith(flag + "=")
    ]


def duration_s(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", text)
    if not m:
        raise ValueError(f"not a duration: {text}")
    n, unit = int(m.group(1)), m.group(2) or "s"
    return n / 1000 if unit == "ms" else n * {"s": 1, "m": 60, "h": 3600}[unit]


def quantity(q):
    """A Kubernetes quantity as a float (enough for comparisons here)."""
    q = str(q)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for u, f in units.items():
        if q.endswith(u):
            return float(q[: -len(u)]) * f
    return float(q)


def flotilla_args(c):
    """(subcommand, args after it) of a container running flotilla, else (None, [])."""
    words = list(c.get("command", []) or []) + list(c.get("args", []) or [])
    if "flotilla" in words:
        words = words[words.index("flotilla") + 1 :]
    elif c.get("command"):
        return None, []
    return (words[0], words[1:]) if words else (None, [])


# --- custom resources --------------------------------------------------------------------

# The fields KEDA's ScaledObject CRD (keda.sh/v1alpha1, KEDA 2.x) defines.
SO_SPEC = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount",
           "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers"}
SO_TRIGGER = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
SO_ADVANCED = {"restoreToOriginalReplicaCount", "horizontalPodAutoscalerConfig", "scalingModifiers"}
SO_HPA_CONFIG = {"name", "behavior"}
# The prometheus scaler's parameters (keda.sh/docs/latest/scalers/prometheus).
PROM_TRIGGER_META = {"serverAddress", "query", "threshold", "activationThreshold", "namespace", "customHeaders",
                     "ignoreNullValues", "queryParameters", "unsafeSsl", "timeout"}
# prometheus-operator's ServiceMonitor (monitoring.coreos.com/v1), the fields used here.
SM_SPEC = {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels", "podTargetLabels",
           "sampleLimit", "scrapeProtocols", "attachMetadata", "labelLimit", "fallbackScrapeProtocol"}
SM_ENDPOINT = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "authorization",
               "bearerTokenSecret", "tlsConfig", "basicAuth", "oauth2", "honorLabels", "honorTimestamps",
               "relabelings", "metricRelabelings", "params", "followRedirects", "enableHttp2", "proxyUrl"}


def int_field(d, k):
    return k not in d or (isinstance(d[k], int) and not isinstance(d[k], bool))


def check_behavior(where, b):
    ok = True
    for side in ("scaleUp", "scaleDown"):
        rules = (b or {}).get(side)
        if rules is None:
            continue
        ok &= set(rules) <= {"policies", "selectPolicy", "stabilizationWindowSeconds"}
        ok &= 0 <= rules.get("stabilizationWindowSeconds", 0) <= 3600
        for p in rules.get("policies", []):
            ok &= set(p) == {"type", "value", "periodSeconds"} and p["type"] in ("Pods", "Percent")
            ok &= isinstance(p["value"], int) and p["value"] > 0 and 0 < p["periodSeconds"] <= 1800
    return check(ok, f"{where}: HPA behavior (scaleUp/scaleDown policies) well formed")


def check_scaledobject(name, o, objs, metrics, states):
    where = f"{name}: ScaledObject/{o['metadata']['name']}"
    spec = o.get("spec", {})
    check(o["apiVersion"] == "keda.sh/v1alpha1", f"{where}: apiVersion keda.sh/v1alpha1")
    check(set(spec) <= SO_SPEC, f"{where}: only fields the CRD defines (extra: {sorted(set(spec) - SO_SPEC)})")
    check(all(int_field(spec, k) for k in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount")),
          f"{where}: counts and periods are integers")
    check(0 <= spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100),
          f"{where}: 0 <= minReplicaCount <= maxReplicaCount")
    ref = spec.get("scaleTargetRef", {})
    target = [x for x in objs if x["kind"] == ref.get("kind", "Deployment") and x["metadata"]["name"] == ref.get("name")]
    check(ref.get("apiVersion", "apps/v1") == "apps/v1" and len(target) == 1,
          f"{where}: scaleTargetRef names a {ref.get('kind', 'Deployment')} of this render ({ref.get('name')})")
    adv = spec.get("advanced", {})
    check(set(adv) <= SO_ADVANCED and set(adv.get("horizontalPodAutoscalerConfig", {})) <= SO_HPA_CONFIG,
          f"{where}: advanced.* fields the CRD defines")
    check_behavior(where, adv.get("horizontalPodAutoscalerConfig", {}).get("behavior"))
    triggers = spec.get("triggers", [])
    check(isinstance(triggers, list) and len(triggers) >= 1, f"{where}: at least one trigger")
    for t in triggers:
        tw = f"{where}: trigger {t.get('type')}"
        check(set(t) <= SO_TRIGGER and "type" in t and isinstance(t.get("metadata"), dict),
              f"{tw}: type and metadata, no field the CRD lacks")
        meta = t.get("metadata", {})
        check(all(isinstance(v, str) for v in meta.values()), f"{tw}: metadata values are strings (CRD: map of string)")
        check(t.get("metricType", "AverageValue") in ("AverageValue", "Value"), f"{tw}: metricType AverageValue or Value")
        if t.get("type") == "prometheus":
            check({"serverAddress", "query", "threshold"} <= set(meta) and set(meta) <= PROM_TRIGGER_META,
                  f"{tw}: serverAddress, query, threshold; no unknown parameter")
            check(re.match(r"^https?://", meta.get("serverAddress", "")), f"{tw}: serverAddress is an http(s) URL")
            try:
                check(float(meta.get("threshold", "x")) > 0, f"{tw}: threshold is a positive number")
            except ValueError:
                check(False, f"{tw}: threshold is a positive number")
            check_query(tw, meta.get("query", ""), metrics, states)


def check_query(where, query, metrics, states):
    used = set(re.findall(r"\bflotilla_[a-z_]+\b", query))
    check(used and used <= metrics, f"{where}: queries metrics the coordinator exports ({', '.join(sorted(used))})")
    for m in re.finditer(r'state=~?"([^"]*)"', query):
        vals = set(m.group(1).split("|"))
        check(vals <= states, f"{where}: state values {sorted(vals)} are states the coordinator labels")


def check_servicemonitor(name, o, objs):
    where = f"{name}: ServiceMonitor/{o['metadata']['name']}"
    spec = o.get("spec", {})
    check(o["apiVersion"] == "monitoring.coreos.com/v1", f"{where}: apiVersion monitoring.coreos.com/v1")
    check(set(spec) <= SM_SPEC, f"{where}: only fields the CRD defines (extra: {sorted(set(spec) - SM_SPEC)})")
    services = [s for s in objs if s["kind"] == "Service" and labels_match(spec.get("selector"), s["metadata"].get("labels", {}))]
    check(len(services) == 1 and services[0]["metadata"]["name"] == "flotilla-coordinator",
          f"{where}: selector selects the coordinator's Service")
    port_names = {p.get("name") for s in services for p in s["spec"].get("ports", [])}
    for e in spec.get("endpoints", []):
        check(set(e) <= SM_ENDPOINT, f"{where}: endpoint fields the CRD defines")
        check(e.get("port") in port_names, f"{where}: endpoint port {e.get('port')!r} is a named port of the Service")
        check(e.get("path") == "/metrics", f"{where}: path /metrics")
        auth = e.get("authorization", {})
        check(auth.get("type") == "Bearer" and auth.get("credentials", {}).get("name") == METRICS_SECRET
              and auth.get("credentials", {}).get("key"), f"{where}: Bearer token from Secret {METRICS_SECRET}")


# --- the objects -------------------------------------------------------------------------


def check_schemas(name, objs, version):
    for o in objs:
        ident = f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"
        if o["kind"] in ("ScaledObject", "ServiceMonitor"):
            print(f"note  {name}: {ident}: a custom resource, not in the API schemas: checked field by field below")
            continue
        try:
            kubernetes_validate.validate(o, version, strict=True)
            check(True, f"{name}: {ident} valid against the Kubernetes {version} schema (strict)")
        except kubernetes_validate.SchemaNotFoundError as e:
            check(False, f"{name}: {ident}: {e.message}")
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.absolute_path)
            check(False, f"{name}: {ident} at {path}: {e.message}")


def check_common(name, objs):
    seen = set()
    for o in objs:
        key = (o["kind"], o["metadata"]["name"])
        check(key not in seen, f"{name}: {key[0]}/{key[1]} appears once")
        seen.add(key)
        if o["kind"] not in NON_NAMESPACED:
            check(o["metadata"].get("namespace") == NAMESPACE, f"{name}: {key[0]}/{key[1]} in namespace {NAMESPACE}")
        check(o["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "flotilla",
              f"{name}: {key[0]}/{key[1]} labelled app.kubernetes.io/part-of=flotilla")


def check_coordinator_token(name, where, o, spec, objs):
    """The coordinator mounts a token only to set its workers' pod deletion costs: its service
    account is bound to one Role, which allows `patch` on pods and nothing else, and it runs
    with --pod-deletion-cost (or mounts no token and runs without)."""
    _, args = flotilla_args(spec["containers"][0])
    wanted = "--pod-deletion-cost" in args
    mounted = spec.get("automountServiceAccountToken") is True
    check(mounted == wanted, f"{where}: a service account token mounted exactly when it runs with --pod-deletion-cost"
          f" (mounted: {mounted}, flag: {wanted})")
    if not mounted:
        return
    sa = spec.get("serviceAccountName")
    check(sa not in (None, "default"), f"{where}: its own service account, not the namespace's default ({sa})")
    accounts = [x for x in objs if x["kind"] == "ServiceAccount" and x["metadata"]["name"] == sa]
    if check(len(accounts) == 1, f"{where}: its service account {sa} is in this render"):
        check(accounts[0].get("automountServiceAccountToken") is False,
              f"{name}: ServiceAccount/{sa} mounts no token unless a pod asks")
    bindings = [b for b in objs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and any(x.get("kind") == "ServiceAccount" and x.get("name") == sa for x in b.get("subjects", []))]
    check(len(bindings) == 1 and bindings[0]["kind"] == "RoleBinding",
          f"{where}: its service account is bound to one Role of its namespace (got {len(bindings)} bindings)")
    for b in bindings:
        subject = [x for x in b["subjects"] if x.get("kind") == "ServiceAccount" and x.get("name") == sa][0]
        check(subject.get("namespace") == o["metadata"].get("namespace"),
              f"{name}: {b['kind']}/{b['metadata']['name']} binds the service account of the coordinator's namespace"
              f" ({subject.get('namespace')})")
        ref = b["roleRef"]
        roles = [r for r in objs if r["kind"] == ref["kind"] and r["metadata"]["name"] == ref["name"]]
        if check(ref["kind"] == "Role" and len(roles) == 1, f"{name}: {b['kind']}/{b['metadata']['name']} names a Role here"):
            rules = [(tuple(r.get("apiGroups", [])), tuple(r.get("resources", [])), tuple(r.get("verbs", [])),
                      tuple(r.get("resourceNames", []))) for r in roles[0].get("rules", [])]
            check(rules == [(("",), ("pods",), ("patch",), ())],
                  f"{name}: Role/{ref['name']} allows `patch` on pods and nothing else (got {rules})")


def check_pods(name, objs, flags):
    for o, t in pod_templates(objs):
        where = f"{name}: {o['kind']}/{o['metadata']['name']}"
        spec, labels = t["spec"], t["metadata"].get("labels", {})
        check(labels_match(o["spec"]["selector"], labels), f"{where}: selector matches its pod template")
        sc = spec.get("securityContext", {})
        check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0,
              f"{where}: pod runs as non-root (runAsUser {sc.get('runAsUser')})")
        check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: seccomp RuntimeDefault")
        if labels.get("app.kubernetes.io/component") == "coordinator":
            check_coordinator_token(name, where, o, spec, objs)
        else:
            check(spec.get("automountServiceAccountToken") is False, f"{where}: no service account token mounted")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in o["spec"].get("volumeClaimTemplates", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            cw = f"{where}: container {c['name']}"
            csc = c.get("securityContext", {})
            check(csc.get("allowPrivilegeEscalation") is False and csc.get("readOnlyRootFilesystem") is True
                  and "ALL" in csc.get("capabilities", {}).get("drop", []),
                  f"{cw}: read-only root filesystem, no privilege escalation, all capabilities dropped")
            res = c.get("resources", {})
            check({"cpu", "memory"} <= set(res.get("requests", {})) and {"cpu", "memory"} <= set(res.get("limits", {})),
                  f"{cw}: cpu and memory requests and limits")
            for r, lim in res.get("limits", {}).items():
                req = res.get("requests", {}).get(r)
                if req is not None:
                    check(quantity(req) <= quantity(lim), f"{cw}: {r} request {req} <= limit {lim}")
            check(c.get("image") and not c["image"].endswith(":latest") and "/" in c["image"],
                  f"{cw}: image set by the overlay ({c.get('image')})")
            for m in c.get("volumeMounts", []):
                check(m["name"] in volumes or m["name"] in claims, f"{cw}: volume {m['name']} is defined")
            env = container_env(c)
            words = list(c.get("command", []) or []) + list(c.get("args", []) or [])
            refs = {r for w in words for r in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", w)}
            check(refs <= set(env), f"{cw}: every $(VAR) in its command is in its env ({', '.join(sorted(refs)) or 'none'})")
            ports = {p.get("name") for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if p:
                    port = (p.get("tcpSocket") or p.get("httpGet") or {}).get("port")
                    check(port in ports or isinstance(port, int), f"{cw}: {probe} port {port!r} is one of its ports")
            sub, args = flotilla_args(c)
            if sub in ("server", "worker"):
                known = flags.get(sub, set()) | flags.get("", set())
                used = {a.split("=", 1)[0] for a in args if a.startswith("--")}
                check(used <= known, f"{cw}: `flotilla {sub}` flags exist in docs/cli.md "
                      f"(unknown: {', '.join(sorted(used - known)) or 'none'})")
        for v in volumes.values():
            if "secret" in v:
                check(v["secret"]["secretName"] in (ADMIN_SECRET, WORKER_SECRET, TLS_SECRET),
                      f"{where}: Secret {v['secret']['secretName']} is one docs/kubernetes.md says to create")


def coordinator(objs):
    return [o for o in objs if o["kind"] == "StatefulSet"
            and o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "coordinator"]


def workers(objs):
    return [o for o in objs if o["kind"] == "Deployment"
            and o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"]


def secret_file(spec, c, path):
    """(volume, mount, Secret key, mode) of the file `path` when container c has it from a
    Secret volume, else None. The mode is the item's, else the volume's defaultMode, else
    Kubernetes' default 0644."""
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    best = None
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if m.get("subPath") or not path.startswith(mp + "/"):
            continue
        if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
            best = m
    if best is None or "secret" not in vols.get(best["name"], {}):
        return None
    v = vols[best["name"]]
    rel = path[len(best["mountPath"].rstrip("/")) + 1 :]
    sec = v["secret"]
    items = sec.get("items")
    if items is None:
        return v, best, rel, sec.get("defaultMode", 0o644)  # every key, as a file of its name
    for i in items:
        if i["path"] == rel:
            return v, best, i["key"], i.get("mode", sec.get("defaultMode", 0o644))
    return None


def check_tls(name, objs):
    """components/tls: the coordinator serves TLS from the Secret's certificate and key, every
    worker verifies it with the Secret's CA and holds no key; without it, no side has TLS."""
    coords, ws = coordinator(objs), workers(objs)
    if not coords:
        return
    c0 = coords[0]["spec"]["template"]
    cc = c0["spec"]["containers"][0]
    _, cargs = flotilla_args(cc)
    tls = "--tls-cert" in cargs
    for o in ws:
        t = o["spec"]["template"]
        wc = t["spec"]["containers"][0]
        _, wargs = flotilla_args(wc)
        where = f"{name}: Deployment/{o['metadata']['name']}"
        check(("--tls-ca" in wargs) == tls,
              f"{where}: --tls-ca {'given' if tls else 'absent'}, as the coordinator "
              f"{'serves' if tls else 'does not serve'} TLS")
        if tls and "--tls-ca" in wargs:
            ca = flag_values(wargs, "--tls-ca")
            f = secret_file(t["spec"], wc, ca[0]) if ca else None
            check(f is not None and f[0]["secret"]["secretName"] == TLS_SECRET and f[2] == "ca.crt",
                  f"{where}: --tls-ca is the key ca.crt of the Secret {TLS_SECRET}")
        for v in t["spec"].get("volumes", []):
            sec = v.get("secret", {})
            if sec.get("secretName") == TLS_SECRET:
                keys = [i["key"] for i in sec.get("items") or []]
                check(sec.get("items") and "tls.key" not in keys,
                      f"{where}: mounts only {', '.join(keys) or 'every key'} of {TLS_SECRET}, never tls.key")
    if not tls:
        return
    where = f"{name}: StatefulSet/{coords[0]['metadata']['name']}"
    for flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        vals = flag_values(cargs, flag)
        f = secret_file(c0["spec"], cc, vals[0]) if vals else None
        check(f is not None and f[0]["secret"]["secretName"] == TLS_SECRET and f[2] == key,
              f"{where}: {flag} is the key {key} of the Secret {TLS_SECRET}")
        if f is not None and key == "tls.key":
            check(f[3] & 0o007 == 0, f"{where}: the TLS key is not readable by others (mode {f[3]:o})")


def check_admin_token(where, spec, c, args):
    """The admin token: --admin-token-file, a file of Secret ADMIN_SECRET mounted read-only,
    never world-readable (the server refuses that) and readable by the server's user through
    the pod's fsGroup (Secret files are root's, group fsGroup)."""
    files = flag_values(args, "--admin-token-file")
    env = container_env(c).get("FLOTILLA_ADMIN_TOKEN_FILE", {}).get("value")
    check(len(files) == 1 and env in (None, files[0]),
          f"{where}: the server takes its admin token from --admin-token-file ({', '.join(files) or 'none'})")
    if not files:
        return
    path = files[0]
    check(not path.startswith(STATE_DIR + "/"), f"{where}: --admin-token-file {path} is outside the state volume")
    found = secret_file(spec, c, path)
    if not check(found and found[0]["secret"].get("secretName") == ADMIN_SECRET,
                 f"{where}: --admin-token-file {path} is a file of Secret {ADMIN_SECRET} mounted in the server's container"):
        return
    vol, mount, key, mode = found
    check(key == "token", f"{where}: {path} is the key \"token\" of Secret {ADMIN_SECRET} (docs/kubernetes.md)"
          + ("" if key == "token" else f" (got {key!r})"))
    check(mount.get("readOnly") is True, f"{where}: Secret volume {vol['name']} mounted read-only at {mount['mountPath']}")
    is_mode = isinstance(mode, int) and not isinstance(mode, bool) and 0 <= mode <= 0o777
    shown = f"{mode:04o}" if is_mode else repr(mode)
    check(is_mode and mode & 0o007 == 0,
          f"{where}: {path} is not world-readable (mode {shown}; the server refuses a file others may read)")
    # The kubelet writes a Secret's files as root, group fsGroup: uid 10001 reads the file
    # through that group (the pod's fsGroup is among its groups), never as its owner.
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    check(fs_group is not None and is_mode and mode & 0o040,
          f"{where}: {path} is readable by the server's user: group-readable (mode {shown}), the group"
          f" being the pod's fsGroup ({fs_group})")
    # The old mechanism (an init container copying the Secret to STATE/token) must not come
    # back: it would leave a copy of the admin token on the volume, which the server ignores.
    words = [w for x in spec.get("initContainers", []) + spec["containers"]
             for w in (x.get("command", []) or []) + (x.get("args", []) or [])]
    check(not any(f"{STATE_DIR}/token" in w for w in words),
          f"{where}: nothing writes {STATE_DIR}/token (the server neither reads nor writes it with --admin-token-file)")


def check_coordinator(name, objs):
    sts = coordinator(objs)
    if not check(len(sts) == 1, f"{name}: one coordinator StatefulSet"):
        return
    s = sts[0]
    where = f"{name}: StatefulSet/{s['metadata']['name']}"
    spec = s["spec"]["template"]["spec"]
    c = spec["containers"][0]
    sub, args = flotilla_args(c)
    if "--node-id" in args:
        check_group(name, s, c, args, objs)
    else:
        check(s["spec"].get("replicas") == 1, f"{where}: one replica (a state folder takes one coordinator)")
    check(sub == "server", f"{where}: runs `flotilla server`")
    check(flag_values(args, "--listen") == ["0.0.0.0:7070"], f"{where}: --listen 0.0.0.0:7070")
    check(flag_values(args, "--http-listen") == ["0.0.0.0:9090"], f"{where}: --http-listen 0.0.0.0:9090 (dashboard, /metrics)")
    check(flag_values(args, "--state") == [STATE_DIR], f"{where}: --state {STATE_DIR}")
    # The gang rendezvous: a fixed port (0, the default, lets the kernel pick one at start,
    # which neither the Service nor the NetworkPolicy could list), bound on --listen's IP.
    rdv = flag_values(args, "--rendezvous-port")
    rdv_port = int(rdv[0]) if len(rdv) == 1 and rdv[0].isdigit() else None
    check(rdv_port is not None and 0 < rdv_port < 65536,
          f"{where}: --rendezvous-port is a fixed port, not 0 ({', '.join(rdv) or 'unset: the kernel picks one'})")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(rdv_port is not None and ports.get("rendezvous") == rdv_port,
          f"{where}: container port \"rendezvous\" declared as --rendezvous-port {rdv_port}"
          f" (got {ports.get('rendezvous')})")
    others = [str(ports.get(n)) for n in ("api", "http")]
    check(rdv_port is not None and str(rdv_port) not in others,
          f"{where}: the rendezvous port {rdv_port} is neither the API's nor the HTTP port ({', '.join(others)})")
    claims = {t["metadata"]["name"] for t in s["spec"].get("volumeClaimTemplates", [])}
    mounted = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    check(mounted.get(STATE_DIR) in claims, f"{where}: {STATE_DIR} is a PersistentVolumeClaim template")
    check_admin_token(where, spec, c, args)
    # The Service the workers name.
    svc = [x for x in objs if x["kind"] == "Service" and x["metadata"]["name"] == s["spec"]["serviceName"]]
    if check(len(svc) == 1, f"{where}: its serviceName {s['spec']['serviceName']} is a Service here"):
        sv = svc[0]["spec"]
        check(sv.get("clusterIP") == "None", f"{name}: Service/{svc[0]['metadata']['name']} is headless")
        check(labels_match({"matchLabels": sv["selector"]}, s["spec"]["template"]["metadata"]["labels"]),
              f"{name}: Service/{svc[0]['metadata']['name']} selects the coordinator pod")
        for p in sv["ports"]:
            tp = p.get("targetPort", p["port"])
            check(tp in ports or tp in ports.values(), f"{name}: Service port {p['name']} -> container port {tp}")
        # Ranks connect to the host of --server at the port the coordinator reports: the
        # Service must expose the rendezvous at that same number.
        exposed = [p for p in sv["ports"] if ports.get(p.get("targetPort"), p.get("targetPort")) == rdv_port]
        check(rdv_port is not None and len(exposed) == 1 and exposed[0]["port"] == rdv_port
              and exposed[0].get("protocol", "TCP") == "TCP",
              f"{name}: Service/{svc[0]['metadata']['name']} exposes the rendezvous on TCP {rdv_port}"
              f" (the port ranks are told)")


def check_group(name, s, c, args, objs):
    """components/ha: as many nodes as --peers lists, each named as its pod resolves, started
    together, probed where every node listens, reachable by the others before any is ready."""
    where = f"{name}: StatefulSet/{s['metadata']['name']}"
    n, sts, svc_name = s["spec"].get("replicas"), s["metadata"]["name"], s["spec"]["serviceName"]
    check(flag_values(args, "--node-id") == ["ordinal"], f"{where}: --node-id ordinal (each pod its own node)")
    peers = ",".join(flag_values(args, "--peers")).split(",")
    want = [f"{sts}-{i}.{svc_name}:7070" for i in range(n or 0)]
    check(n in (3, 5) and peers == want,
          f"{where}: {n} replicas, --peers names each pod as its Service resolves it, in ordinal order "
          f"({', '.join(peers)})")
    check(s["spec"].get("podManagementPolicy") == "Parallel",
          f"{where}: podManagementPolicy Parallel (one pod alone never becomes ready: it needs a majority)")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(ports.get("group") == ports.get("api", 0) + 1, f"{where}: container port \"group\" is the API port + 1")
    # Followers open no other port; and a rolling update waits for each pod to be ready.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = (c.get(probe, {}).get("tcpSocket") or {}).get("port")
        check(port == "group", f"{where}: {probe} on the group port (every node listens there)")
    svc = [x for x in objs if x["kind"] == "Service" and x["metadata"]["name"] == svc_name]
    if svc:
        sv = svc[0]["spec"]
        check(sv.get("publishNotReadyAddresses") is True,
              f"{name}: Service/{svc_name} publishes pods not ready (the nodes find each other before a leader)")
        check(any(p.get("targetPort") == "group" for p in sv.get("ports", [])),
              f"{name}: Service/{svc_name} lists the group port")
    labels = s["spec"]["template"]["metadata"]["labels"]
    admitted = False
    for np in (x for x in objs if x["kind"] == "NetworkPolicy"):
        if not labels_match(np["spec"]["podSelector"], labels):
            continue
        for rule in np["spec"].get("ingress", []):
            froms = [f.get("podSelector") for f in rule.get("from", []) if "namespaceSelector" not in f]
            if any(f and labels_match(f, labels) for f in froms) and any(
                    p.get("port") == "group" for p in rule.get("ports", [])):
                admitted = True
    check(admitted, f"{name}: the coordinators' NetworkPolicy admits the other coordinators on the group port")


def check_workers(name, objs):
    ws = workers(objs)
    check(len(ws) >= 1, f"{name}: at least one worker Deployment")
    coord = coordinator(objs)
    svc = coord[0]["spec"]["serviceName"] if coord else None
    for d in ws:
        where = f"{name}: Deployment/{d['metadata']['name']}"
        spec = d["spec"]["template"]["spec"]
        c = spec["containers"][0]
        sub, args = flotilla_args(c)
        env = container_env(c)
        check(sub == "worker", f"{where}: runs `flotilla worker`")
        check(flag_values(args, "--name") == ["$(FLOTILLA_POD_NAME)"], f"{where}: --name $(FLOTILLA_POD_NAME)")
        for var, path in (("FLOTILLA_POD_NAME", "metadata.name"), ("FLOTILLA_NODE_NAME", "spec.nodeName"),
                          ("FLOTILLA_POD_IP", "status.podIP")):
            got = env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            check(got == path, f"{where}: env {var} from the Downward API {path}")
        dl = flag_values(args, "--data-listen")
        check(dl == ["$(FLOTILLA_POD_IP):7071"],
              f"{where}: --data-listen binds the pod IP on 7071 (advertised as bound; 0.0.0.0 would"
              " depend on resolving the coordinator at the worker's start)")
        server = (flag_values(args, "--server") or [env.get("FLOTILLA_SERVER", {}).get("value", "")])[0]
        check(svc and server.split(":")[0] in (svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc")
              and server.endswith(":7070"), f"{where}: reaches the coordinator at its Service name ({server})")
        tf = flag_values(args, "--token-file")
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        tok_vol = vols.get(mounts.get(str(Path(tf[0]).parent))) if tf else None
        check(tok_vol and tok_vol.get("secret", {}).get("secretName") == WORKER_SECRET
              and any(i["path"] == Path(tf[0]).name for i in tok_vol["secret"].get("items", [])),
              f"{where}: --token-file is Secret {WORKER_SECRET} (an enrolment token, not the admin's)")
        # The kubelet's SIGTERM drains the worker (tini forwards it): the pod's grace period
        # must cover what the worker waits after it, --grace + 15 s, with a margin for the
        # checkpoints' upload.
        grace = flag_values(args, "--grace")
        g = duration_s(grace[0]) if grace else 30
        tgps = spec.get("terminationGracePeriodSeconds", 30)
        check(tgps >= g + WORKER_LEAVE_SLACK_S + WORKER_LEAVE_MARGIN_S,
              f"{where}: terminationGracePeriodSeconds {tgps} >= --grace {g:g}s + {WORKER_LEAVE_SLACK_S}s"
              f" + {WORKER_LEAVE_MARGIN_S}s margin")
        check(c.get("command", [])[:2] == ["tini", "--"],
              f"{where}: tini as PID 1 (reaps orphans, forwards SIGTERM to the worker)")
        # The preStop hook that sent SIGINT (from before the worker drained on SIGTERM) must
        # not come back: a hook signalling the worker would only race the kubelet's SIGTERM.
        hooks = c.get("lifecycle", {}) or {}
        pre = hooks.get("preStop", {}) or {}
        words = " ".join(pre.get("exec", {}).get("command", []) or [])
        check(not re.search(r"\bkill\b|SIGINT|-INT\b", words),
              f"{where}: no preStop hook signalling the worker (SIGTERM drains it)"
              + (f" (got: {words})" if words else ""))
        req = c.get("resources", {}).get("requests", {})
        cpus = env.get("FLOTILLA_CPUS", {}).get("valueFrom", {}).get("resourceFieldRef", {})
        check(flag_values(args, "--cpus") == ["$(FLOTILLA_CPUS)"] and cpus.get("resource") == "requests.cpu"
              and "cpu" in req, f"{where}: offers the CPUs it requests")
        mem = env.get("FLOTILLA_MEM", {}).get("valueFrom", {}).get("resourceFieldRef", {})
        check(flag_values(args, "--mem") == ["$(FLOTILLA_MEM)"] and mem.get("resource") == "requests.memory"
              and mem.get("divisor") in ("1", 1), f"{where}: offers the memory it requests, in bytes")
        wd = flag_values(args, "--work-dir")
        check(wd and wd[0] in mounts and "emptyDir" in vols.get(mounts[wd[0]], {}), f"{where}: --work-dir is an emptyDir")


def gpu_containers(objs):
    out = []
    for o, t in pod_templates(objs):
        for c in t["spec"]["containers"]:
            lim = c.get("resources", {}).get("limits", {})
            if "nvidia.com/gpu" in lim or "nvidia.com/gpu" in c.get("resources", {}).get("requests", {}):
                out.append((o, t, c))
    return out


CLIENT_LABELS = {"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "client"}


def check_network_policies(name, objs):
    pols = [o for o in objs if o["kind"] == "NetworkPolicy"]
    pods = [(o, t["metadata"]["labels"], t["spec"]["containers"][0]) for o, t in pod_templates(objs)]
    for p in pols:
        sel = p["spec"]["podSelector"]
        check(any(labels_match(sel, lab) for _, lab, _ in pods),
              f"{name}: NetworkPolicy/{p['metadata']['name']} selects pods of this render")
        # A named port that no selected pod declares admits nothing, silently.
        for o, lab, c in pods:
            if not labels_match(sel, lab):
                continue
            names = {x.get("name") for x in c.get("ports", [])}
            used = {x["port"] for r in p["spec"].get("ingress", []) for x in r.get("ports", []) or []
                    if isinstance(x.get("port"), str)}
            check(used <= names, f"{name}: NetworkPolicy/{p['metadata']['name']}: its named ports"
                  f" ({', '.join(sorted(used)) or 'none'}) are ports of {o['kind']}/{o['metadata']['name']}")
    worker_pods = [(lab, c) for o, lab, c in pods if lab.get("app.kubernetes.io/component") == "worker"]
    coord = [(lab, c) for o, lab, c in pods if lab.get("app.kubernetes.io/component") == "coordinator"]

    def container_port(c, port_name):
        return next((x for x in c.get("ports", []) if x.get("name") == port_name), None)

    def admits(x, cport):
        """Whether the NetworkPolicy port x (name or number, endPort, protocol) covers cport."""
        if x.get("protocol", "TCP") != cport.get("protocol", "TCP"):
            return False
        port = x.get("port")
        if port is None:
            return True
        if isinstance(port, str):
            return port == cport.get("name")
        return port <= cport["containerPort"] <= x.get("endPort", port)

    def allowed(target, from_labels, port_name):
        """Whether some policy selecting the target (labels, container) admits pods labelled
        from_labels on the target's container port named port_name."""
        target_labels, c = target
        cport = container_port(c, port_name)
        if cport is None:
            return False
        for p in pols:
            if not labels_match(p["spec"]["podSelector"], target_labels):
                continue
            for rule in p["spec"].get("ingress", []):
                peers = [f for f in rule.get("from", []) if "namespaceSelector" not in f and "ipBlock" not in f]
                if any(labels_match(f.get("podSelector"), from_labels) for f in peers):
                    ports = rule.get("ports")
                    if not ports or any(admits(x, cport) for x in ports):
                        return True
        return False

    for wl, wc in worker_pods:
        kind = wl.get("flotilla.io/worker-kind")
        check(any(labels_match(p["spec"]["podSelector"], wl) for p in pols), f"{name}: {kind} workers are under a NetworkPolicy")
        for other, _ in worker_pods:
            check(allowed((wl, wc), other, "data"),
                  f"{name}: {other.get('flotilla.io/worker-kind')} workers may reach {kind} workers' data port")
        if coord:
            # Exactly the API and the gang rendezvous (the ranks are tasks in worker pods).
            got = sorted(x["name"] for x in coord[0][1].get("ports", []) if allowed(coord[0], wl, x["name"]))
            check(got == ["api", "rendezvous"],
                  f"{name}: {kind} workers may reach the coordinator's API and rendezvous ports, no other"
                  f" (admitted: {', '.join(got) or 'none'})")
    if coord:
        check(any(labels_match(p["spec"]["podSelector"], coord[0][0]) for p in pols),
              f"{name}: the coordinator is under a NetworkPolicy")
        got = sorted(x["name"] for x in coord[0][1].get("ports", []) if allowed(coord[0], CLIENT_LABELS, x["name"]))
        check(got == ["api"], f"{name}: client pods may reach the coordinator's API port, no other"
              f" (admitted: {', '.join(got) or 'none'})")
        # Every port of the coordinator is fixed by a flag: no rule opens them all.
        rules = [r for p in pols if labels_match(p["spec"]["podSelector"], coord[0][0])
                 for r in p["spec"].get("ingress", [])]
        check(all(r.get("ports") and all(x.get("port") is not None for x in r["ports"]) for r in rules),
              f"{name}: each ingress rule of the coordinator names its ports (none opens every port)")
        scrape = [r for r in rules if any("namespaceSelector" in f for f in r.get("from", []))]
        check(scrape and all([x.get("port") for x in r.get("ports", [])] == ["http"] for r in scrape),
              f"{name}: the scraper's rule opens the coordinator's HTTP port only")


def check_overlay(name, objs, metrics, states):
    base, *components = name.split("+")
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs)
    expected = {"Service/flotilla-coordinator", "StatefulSet/flotilla-coordinator", "Deployment/flotilla-worker-cpu",
                "NetworkPolicy/flotilla-coordinator", "NetworkPolicy/flotilla-worker",
                "ServiceAccount/flotilla-coordinator", "Role/flotilla-pod-deletion-cost",
                "RoleBinding/flotilla-pod-deletion-cost"}
    if base == "gpu":
        expected.add("Deployment/flotilla-worker-gpu")
    if "autoscale-keda" in components:
        expected.add("ScaledObject/flotilla-worker-cpu")
    if "autoscale-hpa" in components:
        expected.add("HorizontalPodAutoscaler/flotilla-worker-cpu")
    if "prometheus-servicemonitor" in components:
        expected.add("ServiceMonitor/flotilla-coordinator")
    check(set(kinds) == expected, f"{name}: holds exactly {', '.join(sorted(expected))}"
          + ("" if set(kinds) == expected else f" (got {', '.join(kinds)})"))
    gpus = gpu_containers(objs)
    if base == "cpu-only":
        check(not gpus, f"{name}: no container requests nvidia.com/gpu")
    if base == "gpu":
        if check(gpus, f"{name}: a container requests nvidia.com/gpu"):
            for o, t, c in gpus:
                where = f"{name}: {o['kind']}/{o['metadata']['name']}"
                res = c["resources"]
                n = res.get("limits", {}).get("nvidia.com/gpu")
                check(n is not None and int(n) >= 1 and res.get("requests", {}).get("nvidia.com/gpu", n) == n,
                      f"{where}: nvidia.com/gpu limit {n} (= its request)")
                _, args = flotilla_args(c)
                check(flag_values(args, "--gpus") not in (["none"],), f"{where}: offers its GPUs (--gpus {flag_values(args, '--gpus')})")
                check(any(x.get("key") == "nvidia.com/gpu" for x in t["spec"].get("tolerations", [])),
                      f"{where}: tolerates the nvidia.com/gpu taint")
                check(c["image"].endswith("-cuda"), f"{where}: runs the image with the CUDA libraries ({c['image']})")
    for o, t in pod_templates(objs):
        if o not in [g[0] for g in gpus]:
            for c in t["spec"]["containers"]:
                sub, args = flotilla_args(c)
                if sub == "worker":
                    check(flag_values(args, "--gpus") == ["none"], f"{name}: {o['metadata']['name']}: --gpus none without a GPU")
    for o in objs:
        if o["kind"] == "HorizontalPodAutoscaler":
            where = f"{name}: HorizontalPodAutoscaler/{o['metadata']['name']}"
            ref = o["spec"]["scaleTargetRef"]
            check(any(x["kind"] == ref["kind"] and x["metadata"]["name"] == ref["name"] for x in objs),
                  f"{where}: scaleTargetRef names a {ref['kind']} of this render")
            check_behavior(where, o["spec"].get("behavior"))
        if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
            ref = o["spec"]["scaleTargetRef"]
            target = [x for x in objs if x["kind"] == ref.get("kind", "Deployment") and x["metadata"]["name"] == ref["name"]]
            check(target and "replicas" not in target[0]["spec"],
                  f"{name}: {ref['name']}, scaled by {o['kind']}/{o['metadata']['name']}, leaves replicas to it")
        if o["kind"] == "ScaledObject":
            check_scaledobject(name, o, objs, metrics, states)
        if o["kind"] == "ServiceMonitor":
            check_servicemonitor(name, o, objs)


def check_adapter_values(repo, here, metrics, states):
    path = here / "components" / "autoscale-hpa" / "prometheus-adapter-values.yaml"
    where = f"components/autoscale-hpa/{path.name}"
    values = yaml.safe_load(path.read_text())
    rules = values.get("rules", {}).get("external", [])
    hpa = yaml.safe_load((here / "components" / "autoscale-hpa" / "hpa.yaml").read_text())
    wanted = {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "External"}
    names = {r.get("name", {}).get("as") for r in rules}
    check(wanted <= names, f"{where}: defines the External metric the HPA uses ({', '.join(sorted(wanted))})")
    for r in rules:
        check_query(f"{where}: rule {r.get('name', {}).get('as')}", r.get("metricsQuery", ""), metrics, states)


def check_containerfile(repo, objs_all):
    path = repo / "Containerfile"
    where = "Containerfile (static checks; deploy/container/check.sh builds and runs it)"
    if not check(path.exists(), f"{where}: exists"):
        return
    text = path.read_text()
    # The base images are ARGs (a mirror may override them): read FROM with their defaults.
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    froms = [(re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), f), a)
             for f, a in re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)]
    check(any("rust:" in f and "bookworm" in f and a == "builder" for f, a in froms), f"{where}: a rust:*-bookworm builder stage")
    check(re.search(r"cargo build --release --locked -p flotilla\b", text), f"{where}: cargo build --release --locked -p flotilla")
    check(any("debian:bookworm-slim" in f for f, _ in froms), f"{where}: a debian:bookworm-slim runtime stage")
    check(froms and froms[-1][1] == "runtime", f"{where}: the last stage (the default target) is the runtime, not cuda")
    for pkg in ("ca-certificates", "bubblewrap", "ocl-icd-libopencl1", "tini"):
        check(re.search(rf"\b{re.escape(pkg)}\b", text), f"{where}: installs {pkg}")
    check(re.search(r"flotilla-enter", text), f"{where}: installs flotilla-enter beside flotilla (the sandbox holder's door)")
    uid = re.search(r"useradd[^\n]*--uid\s+(\d+)", text)
    check(uid and uid.group(1) == "10001" and re.search(r"^USER\s+10001", text, re.M), f"{where}: user flotilla, uid 10001, numeric USER")
    check(re.search(r'^ENTRYPOINT \["flotilla"\]', text, re.M), f'{where}: ENTRYPOINT ["flotilla"]')
    uids = {t["spec"].get("securityContext", {}).get("runAsUser") for objs in objs_all for _, t in pod_templates(objs)}
    check(uids == {10001}, f"{where}: the manifests run as the image's uid ({uids})")


def check_client_example(name, objs, flags):
    """A client pod of the examples: labelled so the NetworkPolicies admit it, locked down as
    the other pods are, and every `flotilla CMD --flag` in its command exists."""
    templates = list(pod_templates(objs))
    check(templates, f"{name}: holds a pod template")
    for o, t in templates:
        where = f"{name}: {o['kind']}/{o['metadata']['name']}"
        labels = t.get("metadata", {}).get("labels", {})
        check(labels.get("app.kubernetes.io/name") == "flotilla"
              and labels.get("app.kubernetes.io/component") == "client",
              f"{where}: labelled as a flotilla client (the NetworkPolicies admit it)")
        spec = t.get("spec", {})
        check(spec.get("automountServiceAccountToken") is False,
              f"{where}: no service account token")
        check(spec.get("securityContext", {}).get("runAsNonRoot") is True, f"{where}: non-root")
        for c in spec.get("containers", []):
            sc = c.get("securityContext", {})
            check(sc.get("allowPrivilegeEscalation") is False
                  and sc.get("capabilities", {}).get("drop") == ["ALL"],
                  f"{where}/{c['name']}: no privilege escalation, every capability dropped")
            words = " ".join(c.get("command", []) + c.get("args", [])).split()
            for i, w in enumerate(words):
                if w != "flotilla" or i + 1 >= len(words):
                    continue
                cmd, known = words[i + 1], flags.get(words[i + 1])
                check(known is not None, f"{where}: `flotilla {cmd}` is a command (docs/cli.md)")
                for a in words[i + 2:]:
                    if a in ("&&", "||", ";", "|"):
                        break
                    if a.startswith("--"):
                        check(a.split("=", 1)[0] in (known or set()),
                              f"{where}: `flotilla {cmd} {a}` exists (docs/cli.md)")


def main():
    version, repo = sys.argv[1], Path(sys.argv[2])
    here = repo / "deploy" / "kubernetes"
    flags = cli_flags(repo)
    check(flags.get("server") and flags.get("worker"), "docs/cli.md: the server's and worker's flags found")
    metrics, states = metric_names(repo)
    check({"flotilla_tasks", "flotilla_ready_queue_depth"} <= metrics,
          f"http.rs: the coordinator's metrics found ({len(metrics)})")
    rendered = {}
    for arg in sys.argv[3:]:
        name, file = arg.split("=", 1)
        rendered[name] = [o for o in yaml.safe_load_all(Path(file).read_text()) if o]
    for name, objs in rendered.items():
        print(f"--- {name}: {len(objs)} objects")
        check_schemas(name, objs, version)
        check_common(name, objs)
        check_pods(name, objs, flags)
        check_coordinator(name, objs)
        check_workers(name, objs)
        check_network_policies(name, objs)
        check_tls(name, objs)
        check_overlay(name, objs, metrics, states)
    for f in sorted((here / "examples").glob("*.yaml")):
        name = f"examples/{f.name}"
        objs = [o for o in yaml.safe_load_all(f.read_text()) if o]
        print(f"--- {name}: {len(objs)} objects")
        check_schemas(name, objs, version)
        check_client_example(name, objs, flags)
    print("--- outside the renders")
    check_adapter_values(repo, here, metrics, states)
    check_containerfile(repo, list(rendered.values()))
    failed = [t for ok, t in results if not ok]
    print()
    if failed:
        print(f"kubernetes manifests: {len(failed)} of {len(results)} checks FAILED:")
        for t in failed:
            print(f"  {t}")
        sys.exit(1)
    print(f"kubernetes manifests: all {len(results)} checks passed "
          f"({', '.join(rendered)}; Kubernetes {version} schemas)")


if __name__ == "__main__":
    main()
