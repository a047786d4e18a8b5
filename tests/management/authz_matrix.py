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
