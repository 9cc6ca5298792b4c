"""A corpus of realistic secrets, made afresh from a seed: the formats the providers issue (prefixes, lengths,
alphabets, and the checksums GitHub and npm tokens carry), each in the text an agent would paste (a shell session, a
``.env`` file, a config, a log, a prompt), and texts that look like secrets but are not (hashes, ids, public keys),
which must come through unchanged. Random values: no real credential, and no fixed string a detector could know."""

from __future__ import annotations

import base64
import json
import random
import string
import zlib
from dataclasses import dataclass

B62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


@dataclass(frozen=True)
class Leak:
    """A secret, and a text that carries it as an agent would write it."""

    kind: str
    secret: str
    text: str


def _pick(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _base62(number: int, width: int) -> str:
    digits = ""
    while number:
        number, digit = divmod(number, 62)
        digits = B62[digit] + digits
    return digits.rjust(width, "0")


def _checksummed(rng: random.Random, prefix: str) -> str:
    """A GitHub-style token: 30 random characters and the base62 of their CRC-32 (npm's tokens are built alike)."""
    body = _pick(rng, ALNUM, 30)
    return f"{prefix}{body}{_base62(zlib.crc32(body.encode()), 6)}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(rng: random.Random) -> str:
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"sub": str(rng.randrange(10**6)), "name": "Ann", "iat": 1764547200 + rng.randrange(10**6)}
    return f"{header}.{_b64url(json.dumps(claims).encode())}.{_b64url(rng.randbytes(32))}"


def _pem(rng: random.Random, label: str, lines: int) -> tuple[str, str]:
    """A private key block and its body (random DER-sized base64: a detector reads the armour and the body)."""
    body = base64.b64encode(rng.randbytes(48 * lines)).decode()
    wrapped = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {label}-----\n{wrapped}\n-----END {label}-----", wrapped


def _password(rng: random.Random, n: int = 14) -> str:
    """What a person or a password manager makes: letters, digits and a few signs, at least one of each."""
    signs = "!#%^*-_+"
    chars = [rng.choice(string.ascii_lowercase), rng.choice(string.ascii_uppercase), rng.choice(string.digits)]
    chars += [rng.choice(signs)] + [rng.choice(ALNUM + signs) for _ in range(n - 4)]
    rng.shuffle(chars)
    return "".join(chars)


def leaks(seed: int = 40) -> list[Leak]:
    """Secrets of many formats, each in its context (module docstring)."""
    rng = random.Random(seed)
    out: list[Leak] = []

    def add(kind: str, secret: str, template: str) -> None:
        out.append(Leak(kind, secret, template.replace("{s}", secret)))

    openai = f"sk-proj-{_pick(rng, ALNUM + '-_', 74)}T3BlbkFJ{_pick(rng, ALNUM + '-_', 74)}"
    add("openai", openai, "export OPENAI_API_KEY={s}\npython scripts/embed.py --batch 64")
    anthropic = f"sk-ant-api03-{_pick(rng, ALNUM + '-_', 93)}AA"
    add("anthropic", anthropic, 'client = Anthropic(api_key="{s}")  # TODO move to the vault')
    add("github_pat", _checksummed(rng, "ghp_"), "git clone https://github.com/acme/billing.git && export GH_TOKEN={s}")
    add("github_oauth", _checksummed(rng, "gho_"), "gh auth status shows the token {s}, then the push worked.")
    fine = f"github_pat_11{_pick(rng, string.ascii_uppercase + string.digits, 20)}_{_pick(rng, ALNUM, 59)}"
    add("github_fine_grained", fine, "The CI secret GITHUB_TOKEN was set to {s} (it expires in 30 days).")
    add(
        "gitlab",
        f"glpat-{_pick(rng, ALNUM + '-_', 20)}",
        "curl --header 'PRIVATE-TOKEN: {s}' https://gitlab.example.com/api/v4/projects",
    )
    aws_id = "AKIA" + _pick(rng, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
    aws_secret = _pick(rng, ALNUM + "/+", 40)
    add("aws_access_key_id", aws_id, "[default]\naws_access_key_id = {s}\nregion = eu-west-1")
    add("aws_secret_access_key", aws_secret, "[default]\naws_secret_access_key = {s}\noutput = json")
    xoxb = f"xoxb-{rng.randrange(10**11, 10**12)}-{rng.randrange(10**12, 10**13)}-{_pick(rng, ALNUM, 24)}"
    add("slack_bot", xoxb, "SLACK_BOT_TOKEN={s} node bot.js  # the bot posts to #deploys")
    upper = string.ascii_uppercase + string.digits
    webhook = (
        f"https://hooks.slack.com/services/T{_pick(rng, upper, 10)}/B{_pick(rng, upper, 10)}/{_pick(rng, ALNUM, 24)}"
    )
    add("slack_webhook", webhook, "post the summary with curl -X POST -d @msg.json {s}")
    add("stripe", f"sk_live_{_pick(rng, ALNUM, 99)}", "stripe.api_key = '{s}'\nstripe.Charge.create(amount=2000)")
    add("stripe_webhook", f"whsec_{_pick(rng, ALNUM, 32)}", "STRIPE_WEBHOOK_SECRET={s}")
    add("google", f"AIza{_pick(rng, ALNUM + '-_', 35)}", "the maps call failed until I used ?key={s}&libraries=places.")
    add("npm", _checksummed(rng, "npm_"), "//registry.npmjs.org/:_authToken={s}")
    add("huggingface", f"hf_{_pick(rng, ALNUM, 34)}", "huggingface-cli login --token {s}")
    add(
        "pypi",
        f"pypi-AgEIcHlwaS5vcmc{_pick(rng, ALNUM + '-_', 120)}",
        "[pypi]\n  username = __token__\n  password = {s}",
    )
    add("sendgrid", f"SG.{_pick(rng, ALNUM + '-_', 22)}.{_pick(rng, ALNUM + '-_', 43)}", "SENDGRID_API_KEY={s}")
    add("twilio", "SK" + _pick(rng, HEX, 32), "twilio api:core:keys:list showed {s} as the active key")
    add("docker", f"dckr_pat_{_pick(rng, ALNUM + '-_', 27)}", "echo {s} | docker login -u acme --password-stdin")
    add("digitalocean", f"dop_v1_{_pick(rng, HEX, 64)}", "doctl auth init --access-token {s}")
    add("jwt", _jwt(rng), "Authorization: Bearer {s}\nContent-Type: application/json")
    add("bearer_opaque", _pick(rng, ALNUM, 40), 'curl -H "Authorization: Bearer {s}" https://api.example.com/v1/jobs')
    basic = base64.b64encode(f"deploy:{_password(rng)}".encode()).decode()
    add("basic", basic, "the proxy answered 200 once the header Authorization: Basic {s} was sent")
    rsa, rsa_body = _pem(rng, "RSA PRIVATE KEY", 12)
    add("rsa_private_key", rsa_body, "cat ~/.ssh/deploy_rsa\n{s}".replace("{s}", rsa))
    ssh, ssh_body = _pem(rng, "OPENSSH PRIVATE KEY", 7)
    add("openssh_private_key", ssh_body, "the key that works:\n" + ssh)
    pkcs8, pkcs8_body = _pem(rng, "PRIVATE KEY", 10)
    add("pkcs8_private_key", pkcs8_body, "tls:\n  key: |\n" + "\n".join("    " + line for line in pkcs8.splitlines()))
    add("postgres_url", _password(rng), "DATABASE_URL=postgres://app:{s}@db.internal:5432/billing")
    add("mongodb_url", _password(rng), "mongosh 'mongodb+srv://admin:{s}@cluster0.abcde.mongodb.net/prod'")
    add("redis_url", _password(rng, 18), "the cache is redis://:{s}@cache.internal:6379/0")
    add("amqp_url", _password(rng), "CELERY_BROKER_URL=amqp://celery:{s}@rabbit:5672//")
    add("env_short_password", "hunter2", "DB_PASSWORD=hunter2\nDB_USER=app")
    add("env_password", _password(rng), "POSTGRES_PASSWORD={s}\nPOSTGRES_DB=billing")
    add("env_quoted", _password(rng, 20), "export ADMIN_PASSWORD='{s}'")
    add("django_secret", f"django-insecure-{_pick(rng, ALNUM + '!@#%^&*(-_=+)', 50)}", "SECRET_KEY = '{s}'")
    add("env_hex_api_key", _pick(rng, HEX, 32), "API_KEY={s}")
    add("json_password", _password(rng), '{"user": "svc-billing", "password": "{s}", "host": "db"}')
    add("yaml_client_secret", _pick(rng, ALNUM + "~._-", 34), "oauth:\n  client_id: billing-web\n  client_secret: {s}")
    add("stated_password", _password(rng, 12), "I reset it: the new password is {s}, keep it safe.")
    add(
        "azure_storage",
        base64.b64encode(rng.randbytes(64)).decode(),
        "DefaultEndpointsProtocol=https;AccountName=acmedata;AccountKey={s};EndpointSuffix=core.windows.net",
    )
    add(
        "telegram",
        f"{rng.randrange(10**8, 10**9)}:AA{_pick(rng, ALNUM + '-_', 33)}",
        "curl https://api.telegram.org/bot{s}/getMe",
    )
    return out


NOT_SECRETS = (
    "commit 4f1c2e9a81d3b0c5e6f7a8b9c0d1e2f3a4b5c6d7\nAuthor: Ann <ann@example.org>",
    "index 3b18e51..a2c4f09 100644",
    '{"id": "1b4e28ba-2fa1-11d2-883f-0016cb4fb1a7", "status": "done"}',
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  dist/app.tar.gz",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "pytest -q tests/unit --maxfail=1, then git push origin main",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcT3nVhF4bEJ3bGm5bQbQz1YwJ6cW2m3JpB0YlC4x8 ann@laptop",
    "DATABASE_URL=postgres://app:${DB_PASSWORD}@db:5432/app",
    "password = os.environ['DB_PASSWORD']",
    "PASSWORD_MIN_LENGTH=12",
    "the login page asks for a password; the tests mock it",
    "run make deploy ENV=staging, then check /health",
)
"""Texts that look like secrets and are none: hashes, ids, a public key, references to a secret, prose."""
