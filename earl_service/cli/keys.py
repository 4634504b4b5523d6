"""`earl keys create|list|revoke`: the service's API keys, in its store (docs/security.md#keys-and-tenants). A key
is printed once, when made; the store keeps only its salted hash."""

from __future__ import annotations

import argparse
import json

from earl_service.cli.home import add_service_options
from earl_service.errors import UnknownKeyError
from earl_service.service.keys import SCOPES


def add_keys_command(sub) -> None:
    p = sub.add_parser("keys", help="make, list and revoke the service's API keys (tenants and scopes)")
    verbs = p.add_subparsers(dest="verb", required=True)
    create = verbs.add_parser("create", help="make a key; it is printed once, only its hash is kept")
    create.add_argument("name", help="the key's name, as the audit log shows it (letters, digits, _ . -)")
    create.add_argument("--tenant", required=True, help="the tenant whose models and jobs the key sees and makes")
    create.add_argument("--scope", choices=SCOPES, default="read",
                        help="read (models, jobs, predictions), write (also jobs and models), admin (also every "
                             "tenant, keys and the audit log) (default: %(default)s)")
    listing = verbs.add_parser("list", help="every key with its tenant and scopes, revoked ones too (never a key)")
    revoke = verbs.add_parser("revoke", help="revoke a key: it stops working within a second")
    revoke.add_argument("id", help="the key's id (the 12 hex digits after earl_, as `earl keys list` shows)")
    for verb in (create, listing, revoke):
        add_service_options(verb)
    p.set_defaults(func=cmd_keys)


def cmd_keys(a: argparse.Namespace) -> int:
    from earl_service.service.home import ServiceHome
    from earl_service.service.keys import new_key

    store = ServiceHome(a.home).create().open_store(a.store)
    try:
        if a.verb == "create":
            record, key = new_key(a.name, a.tenant, [a.scope])
            store.add_key(record)
            print(json.dumps({**record.shown(), "key": key}))
        elif a.verb == "list":
            print(json.dumps([k.shown() for k in store.list_keys()], indent=1))
        else:
            revoked = store.revoke_key(a.id)
            if revoked is None:
                raise UnknownKeyError(a.id)
            print(json.dumps(revoked.shown()))
    finally:
        store.close()
    return 0
