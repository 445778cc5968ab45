"""Fake secrets of every kind the built-in redaction rules know, for the tests and
benchmarks/bench_redact.py.

Every token is built at run time from parts and random characters: no whole token is
written in the repository (secret scanners of code hosts would flag it, and a sample
must never be a real key).
"""

from __future__ import annotations

import base64
import random
import string
from dataclasses import dataclass

ALNUM = string.ascii_letters + string.digits
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"
HEX = "0123456789abcdef"
BASE32 = string.ascii_uppercase + "234567"


@dataclass(frozen=True)
class Sample:
    kind: str
    #: A line of text holding the secret as a tool output would print it.
    text: str
    #: The part of ``text`` that is replaced by the marker.
    secret: str

    @property
    def redacted(self) -> str:
        return self.text.replace(self.secret, f"[REDACTED:{self.kind}]")


def _r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def pem(rng: random.Random, label: str = "RSA", lines: int = 25, end: bool = True) -> str:
    body = "\n".join(_r(rng, B64, 64) for _ in range(lines))
    head = "-----" + "BEGIN " + (f"{label} " if label else "") + "PRIVATE KEY-----"
    tail = "-----" + "END " + (f"{label} " if label else "") + "PRIVATE KEY-----"
    return f"{head}\n{body}\n{tail}" if end else f"{head}\n{body}"


def samples(seed: int = 29) -> list[Sample]:
    """One or more samples of every built-in kind (tests/core/test_redact.py checks that
    every kind has one)."""
    rng = random.Random(seed)
    out: list[Sample] = []

    def add(kind: str, before: str, secret: str, after: str = "") -> None:
        out.append(Sample(kind, before + secret + after, secret))

    key = pem(rng)
    add("private-key", "cat id_rsa\n", key, "\n$ ")
    add("private-key", "", pem(rng, "OPENSSH", 8))
    add("private-key", '{"private_key": "', pem(rng, "", 10).replace("\n", "\\n"), '"}')
    add("private-key", "truncated: ", pem(rng, "EC", 3, end=False))
    add(
        "anthropic-key",
        "ANTHROPIC_KEY is ",
        "sk-" + "ant-api03-" + _r(rng, URLSAFE, 93) + "AA",
        ".",
    )
    add("openai-key", "key: ", "sk-" + "proj-" + _r(rng, URLSAFE, 156))
    add("openai-key", "old key ", "sk-" + _r(rng, ALNUM, 20) + "T3Blbk" + "FJ" + _r(rng, ALNUM, 20))
    add("huggingface-token", "login with ", "hf" + "_" + _r(rng, string.ascii_letters, 34))
    add("aws-access-key-id", "aws_access_key_id = ", "AK" + "IA" + _r(rng, BASE32, 16), "\n")
    add("aws-secret-access-key", "aws_secret_access_key = ", _r(rng, B64, 40), "\n")
    add("aws-secret-access-key", '{"SecretAccessKey": "', _r(rng, B64, 40), '", "x": 1}')
    add("aws-session-token", "AWS_SESSION_TOKEN=", _r(rng, B64, 300), "\n")
    add("google-api-key", "https://maps.example.com/?q=x&k=", "AI" + "za" + _r(rng, URLSAFE, 35))
    add(
        "azure-storage-key",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=",
        _r(rng, B64, 86) + "==",
        ";EndpointSuffix=core.windows.net",
    )
    add(
        "azure-shared-access-key",
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=",
        _r(rng, B64, 43) + "=",
    )
    add("github-token", "git push with ", "gh" + "p_" + _r(rng, ALNUM, 36), " done")
    add(
        "github-token", "token=", "github" + "_pat_" + _r(rng, ALNUM, 22) + "_" + _r(rng, ALNUM, 59)
    )
    add("gitlab-token", "PRIVATE-TOKEN: ", "glpat" + "-" + _r(rng, URLSAFE, 20))
    add("npm-token", "//registry.npmjs.org/:_authToken=", "npm" + "_" + _r(rng, ALNUM, 36))
    add("pypi-token", "password = ", "pypi-" + "AgEIcHlwaS5vcmc" + _r(rng, URLSAFE, 70))
    add(
        "slack-token",
        "SLACK_BOT=",
        "xo"
        + "xb-"
        + _r(rng, string.digits, 12)
        + "-"
        + _r(rng, string.digits, 13)
        + "-"
        + _r(rng, ALNUM, 24),
    )
    add(
        "slack-webhook",
        "curl -X POST ",
        "https://hooks.slack.com/"
        + "services/T"
        + _r(rng, ALNUM, 8)
        + "/B"
        + _r(rng, ALNUM, 8)
        + "/"
        + _r(rng, ALNUM, 24),
    )
    add("stripe-key", "stripe.api_key = '", "sk" + "_live_" + _r(rng, ALNUM, 24), "'")
    add("stripe-webhook-secret", "secret ", "wh" + "sec_" + _r(rng, ALNUM, 32))
    add("sendgrid-key", "SENDGRID ", "SG" + "." + _r(rng, URLSAFE, 22) + "." + _r(rng, URLSAFE, 43))
    add("twilio-api-key", "api key sid ", "SK" + _r(rng, HEX, 32))
    add("twilio-auth-token", "TWILIO_AUTH_TOKEN=", _r(rng, HEX, 32), "\n")
    add(
        "jwt",
        "cookie: session=",
        "ey"
        + _b64url(b'{"alg":"HS256","typ":"JWT"}')[2:]
        + "."
        + _b64url(b'{"sub":"1234567890","name":"x"}')
        + "."
        + _r(rng, URLSAFE, 43),
        "; Path=/",
    )
    add("authorization-header", "Authorization: Bearer ", "9" + _r(rng, URLSAFE, 39), "\r\n")
    add("authorization-header", '{"authorization": "Basic ', _r(rng, B64, 30) + "==", '"}')
    add("bearer-token", "the header was Bearer ", "a1" + _r(rng, ALNUM + "._-", 38), " then")
    add("url-password", "DATABASE_URL postgresql://app:", "pw-" + _r(rng, ALNUM, 12), "@db:5432/x")
    add(
        "url-token",
        "GET https://api.example.com/v1/items?limit=5&access_token=",
        _r(rng, ALNUM, 30),
        " 200",
    )
    add("env-secret", "DB_PASSWORD=", "hunter2-" + _r(rng, ALNUM, 8), "\nHOME=/root")
    add("cli-secret", "mysql -u root --password=", "s3cr3t" + _r(rng, ALNUM, 6), " -e 'select 1'")
    return out


#: Text that looks near a secret and is not one: none of it may be redacted.
LOOK_ALIKES = [
    "commit 3f9a1c2b7d4e5f60718293a4b5c6d7e8f9012345 (HEAD -> main)",
    "sha256:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "id 0190f6a2-7c1e-7b2a-9c3d-4e5f60718293 and 550e8400-e29b-41d4-a716-446655440000",
    "def connect(password: str, token: str | None = None) -> None: ...",
    'headers["Authorization"] = f"Bearer {token}"',
    "Authorization: Bearer $TOKEN",
    "Bearer tokens are described in RFC 6750; authorization_code grants too.",
    "TOKENIZERS_PARALLELISM=false MAX_TOKENS=4096 MAX_TOKEN=100000000",
    "see https://example.com/path?q=1&page=2 and http://[::1]:8080/x",
    "git@github.com:org/repo.git and ssh://git@host/repo",
    "integrity sha512-" + "A" * 20 + "q" * 60 + "==",
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 user@host",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUF\n-----END CERTIFICATE-----",
    "arn:aws:iam::123456789012:role/deploy ask-ant-colony task-1234 risk-high",
    "the password is in the vault; PASSWORD=$DB_PASSWORD; --password-stdin; --token-file=x",
    "postgresql://app@db:5432/x and postgresql://app:${DB_PASSWORD}@db/x",
    "eyJhbGciOiJub25lIn0 is a header alone",
    "[REDACTED:github-token] stays as it is",
]
