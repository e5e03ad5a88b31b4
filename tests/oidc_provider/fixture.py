"""Start the test provider as its own process, on its own port and SQLite file, with a
signing key made for this run; stopped with the test's other processes."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.processes.support import REPO, Process
from tests.support.polling import wait_until
from tests.support.ports import free_port

CLIENT_ID = "llmgw-test"
PROVIDER_NAME = "Test IdP"
# Who the provider knows, and their groups there: llm-ops maps to operators (and the
# playground), readers to reader, and sales to nothing llmgw admits. ml-leads maps to
# nothing here: the team pages' test adds ml-leads=team:research:lead to the map.
PEOPLE = {
    "lena": ["llm-ops", "staff"],
    "rita": ["readers"],
    "otto": ["sales"],
    "tess": ["ml-leads"],
}
ROLE_MAP = "llm-ops=operators,llm-ops=playground,readers=reader"


def provider_password(username: str) -> str:
    return f"idp-pw-{username}"


@dataclass
class IdentityProvider:
    issuer: str
    client_secret: str
    process: Process
    client_id: str = CLIENT_ID
    name: str = PROVIDER_NAME
    signing_key: rsa.RSAPrivateKey | None = field(default=None, repr=False)

    def llmgw_environment(self) -> dict[str, str]:
        """What a control plane signing in through this provider is given."""
        return {
            "LLMGW_OIDC_ISSUER": self.issuer,
            "LLMGW_OIDC_CLIENT_ID": self.client_id,
            "LLMGW_OIDC_CLIENT_SECRET": self.client_secret,
            "LLMGW_OIDC_NAME": self.name,
            "LLMGW_OIDC_ROLE_MAP": ROLE_MAP,
        }


def start_test_provider(
    processes: list[Process], home: Path, redirect_uris: list[str]
) -> IdentityProvider:
    """A provider that answers its discovery document, with llmgw registered as a client
    that may come back to ``redirect_uris``."""
    home.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = home / "provider-signing-key.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    port = free_port()
    # localhost, not 127.0.0.1 where llmgw listens: the browser keeps each host's
    # cookies apart, as it would for a provider elsewhere.
    issuer = f"http://localhost:{port}/o"
    secret = secrets.token_urlsafe(24)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
        "PROVIDER_SECRET_KEY": secrets.token_urlsafe(40),
        "PROVIDER_DATABASE": str(home / "provider.sqlite3"),
        "PROVIDER_SIGNING_KEY": str(key_file),
        "PROVIDER_ISSUER": issuer,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    spec = home / "provider-spec.json"
    people = [
        {"username": name, "email": f"{name}@example.test", "password": provider_password(name),
         "groups": groups}
        for name, groups in PEOPLE.items()
    ]  # fmt: skip
    spec.write_text(
        json.dumps({"users": people,
                    "client": {"id": CLIENT_ID, "secret": secret, "redirect_uris": redirect_uris}})
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "tests.oidc_provider.prepare", str(spec)],
        env=env, cwd=REPO, check=True, timeout=120,
    )  # fmt: skip
    argv = [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{port}"]
    process = Process(f"oidc-provider-{port}", argv, env, home)
    processes.append(process.start())
    wait_until(
        lambda: _answers(f"{issuer}/.well-known/openid-configuration"),
        60, "the test provider's discovery document",
    )  # fmt: skip
    return IdentityProvider(issuer, secret, process, signing_key=key)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
