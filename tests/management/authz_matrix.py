"""The API authorization matrix: (tags, method, path) -> status and reason, as the machine's
RabbitMQ 3.10 answers for users without permissions (used by tests/management and by
interop-tests/test_management_compat.py against both brokers)."""
from __future__ import annotations

NOT_MGMT = (401, "Not management user")
NOT_ADMIN = (401, "Not administrator user")
NOT_MONITOR = (401, "Not monitor user")
NO_VHOST = (401, "User not authorised to access virtual host")
OK = (200, None)

PATHS = ["/api/overview", "/api/users", "/api/nodes", "/api/policies", "/api/queues",
         "/api/vhosts", "/api/definitions", "/api/connections", "/api/permissions",
         "/api/operator-policies", "/api/health/checks/alarms", "/api/whoami",
         "/api/aliveness-test/%2F"]

EXPECTED: dict[str, dict[str, tuple]] = {
    "": {p: NOT_MGMT for p in PATHS},
    "management": {
        "/api/overview": OK, "/api/users": NOT_ADMIN, "/api/nodes": NOT_MONITOR,
        "/api/policies": OK, "/api/queues": OK, "/api/vhosts": OK, "/api/definitions": NOT_ADMIN,
        "/api/connections": OK, "/api/permissions": NOT_ADMIN, "/api/operator-policies": OK,
        "/api/health/checks/alarms": OK, "/api/whoami": OK, "/api/aliveness-test/%2F": NO_VHOST},
    "monitoring": {
        "/api/overview": OK, "/api/users": NOT_ADMIN, "/api/nodes": OK,
        "/api/policies": OK, "/api/queues": OK, "/api/vhosts": OK, "/api/definitions": NOT_ADMIN,
        "/api/connections": OK, "/api/permissions": NOT_ADMIN, "/api/operator-policies": OK,
        "/api/health/checks/alarms": OK, "/api/whoami": OK, "/api/aliveness-test/%2F": NO_VHOST},
    "policymaker": {
        "/api/overview": OK, "/api/users": NOT_ADMIN, "/api/nodes": NOT_MONITOR,
        "/api/policies": OK, "/api/queues": OK, "/api/vhosts": OK, "/api/definitions": NOT_ADMIN,
        "/api/connections": OK, "/api/permissions": NOT_ADMIN, "/api/operator-policies": OK,
        "/api/health/checks/alarms": OK, "/api/whoami": OK, "/api/aliveness-test/%2F": NO_VHOST},
}

NO_OBJECT = (401, "User not authorised to access object")
_POLICY = {"pattern": "^x", "definition": {"max-length": 1}}
_PERMS = {"configure": ".*", "write": ".*", "read": ".*"}
_PUBLISH = {"routing_key": "x", "payload": "", "payload_encoding": "string", "properties": {}}

# more requests (method, path, body) and what a tagged user without permissions gets; the
# names are prefixed by the caller. A user without tags gets NOT_MGMT for all of them.
REQUESTS = [
    (("GET", "/api/channels", None), OK), (("GET", "/api/consumers", None), OK),
    (("GET", "/api/exchanges", None), OK), (("GET", "/api/bindings", None), OK),
    (("GET", "/api/topic-permissions", None), NOT_ADMIN),
    (("GET", "/api/vhost-limits", None), OK), (("GET", "/api/user-limits", None), OK),
    (("GET", "/api/users/guest", None), NOT_ADMIN),
    (("PUT", "/api/queues/%2F/{p}-q", {}), NO_VHOST),
    (("PUT", "/api/policies/%2F/{p}-p", _POLICY), NO_OBJECT),
    (("PUT", "/api/operator-policies/%2F/{p}-p", _POLICY), NOT_ADMIN),
    (("PUT", "/api/users/{p}-x", {"password": "p", "tags": ""}), NOT_ADMIN),
    (("PUT", "/api/vhosts/{p}-v", {}), NOT_ADMIN),
    (("POST", "/api/definitions", {}), NOT_ADMIN),
    (("PUT", "/api/permissions/%2F/guest", _PERMS), NOT_ADMIN),
    (("GET", "/api/exchanges/%2F/amq.direct", None), NO_VHOST),
    (("POST", "/api/exchanges/%2F/amq.direct/publish", _PUBLISH), NO_VHOST),
    (("GET", "/api/queues/%2F", None), NO_VHOST),
]
