#!/bin/sh
# Installs llmgw @VERSION@'s agent on this node from this bundle, and runs it under systemd.
# Running it again changes nothing that is already as it should be.
# ROOT (default /) lets it be tried in a directory; PIP_INDEX_URL is honoured by pip.
set -eu
ROOT="${ROOT:-}"
HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION="@VERSION@"
WHEEL="@WHEEL@"
WHEEL_SHA256="@WHEEL_SHA256@"
VENV="$ROOT/opt/llmgw"
ETC="$ROOT/etc/llmgw"
UNIT="$ROOT/etc/systemd/system/llmgw-agent.service"
changed=0

say() { echo "install.sh: $*"; }

# Copy a file into place only when it differs, with the mode given.
place() {
    if [ ! -f "$2" ] || ! cmp -s "$1" "$2"; then
        install -m "$3" "$1" "$2"
        say "wrote $2"
        changed=1
    fi
}

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
installed="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("llmgw"))' 2>/dev/null || true)"
if [ "$installed" != "$VERSION" ]; then
    if [ -n "$WHEEL" ]; then
        echo "$WHEEL_SHA256  $HERE/$WHEEL" | sha256sum -c - >/dev/null \
            || { say "$WHEEL does not match its sha256 $WHEEL_SHA256; refusing it"; exit 1; }
        "$VENV/bin/pip" install --quiet --require-hashes -r "$HERE/requirements.lock"
        "$VENV/bin/pip" install --quiet --no-deps "$HERE/$WHEEL"
    else
        # From the index, but only the wheel whose sha256 the bundle names: an index (or a
        # proxy in front of it) that serves anything else is refused.
        download="$(mktemp -d)"
        "$VENV/bin/pip" download --quiet --no-deps --only-binary=:all: -d "$download" "llmgw==$VERSION"
        got="$(ls "$download"/llmgw-*.whl 2>/dev/null | head -n1)"
        [ -n "$got" ] || { say "the index has no wheel of llmgw $VERSION"; exit 1; }
        echo "$WHEEL_SHA256  $got" | sha256sum -c - >/dev/null \
            || { say "$(basename "$got") from the index does not match its sha256 $WHEEL_SHA256; refusing it"; exit 1; }
        # llmgw's dependencies as reviewed: each pinned, each file checked by its sha256.
        "$VENV/bin/pip" install --quiet --require-hashes -r "$HERE/requirements.lock"
        "$VENV/bin/pip" install --quiet --no-deps "$got"
        rm -rf "$download"
    fi
    say "installed llmgw $VERSION"
    changed=1
fi

# Engines run as this user, never as root (docs/security.md); the agent would make it too.
if [ -z "$ROOT" ] && ! id llmgw-engine >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /var/lib/llmgw-agent/engine-home \
        --shell /usr/sbin/nologin --comment "llmgw engines" llmgw-engine
    say "created the engine user llmgw-engine"
fi

mkdir -p "$ETC" "$(dirname "$UNIT")"
chmod 700 "$ETC"
place "$HERE/agent.yaml" "$ETC/agent.yaml" 644
place "$HERE/ca.pem" "$ETC/ca.pem" 644
place "$HERE/node.pem" "$ETC/node.pem" 644
place "$HERE/node-key.pem" "$ETC/node-key.pem" 600

unit_file="$(mktemp)"
cat > "$unit_file" <<UNIT
[Unit]
Description=llmgw node agent
After=network-online.target
Wants=network-online.target

[Service]
Environment=LLMGW_AGENT_CONFIG=/etc/llmgw/agent.yaml
# systemd reads \$\$ as \$ and %% as %: the shell runs celery -Q node-\$(hostname) -n agent@%h.
ExecStart=/bin/sh -c 'exec /opt/llmgw/bin/celery -A agent_worker worker -Q node-\$\$(hostname) -n agent@%%h'
Restart=always
RestartSec=5
KillMode=process

[Install]
WantedBy=multi-user.target
UNIT
place "$unit_file" "$UNIT" 644
rm -f "$unit_file"

if [ "$changed" = 1 ]; then
    systemctl daemon-reload
    systemctl enable llmgw-agent.service
    systemctl restart llmgw-agent.service
    say "llmgw-agent is running"
else
    say "nothing to change"
fi
