"""A local stand-in for the Hugging Face Hub's model-info endpoint (stdlib only): the Hub itself is out of
reach here."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class FakeHub(BaseHTTPRequestHandler):
    """Model info the way the Hub answers it: a gated model, a rejected token, an unknown model."""

    def do_GET(self):
        if self.headers.get("Authorization") == "Bearer hf_bad_token":
            self._reply(
                401,
                {"error": "Invalid credentials"},
                {"X-Error-Message": "Invalid credentials in Authorization header"},
            )
        elif self.path.startswith("/api/models/org/gated-model"):
            body = {
                "id": "org/gated-model",
                "sha": "0" * 40,
                "private": False,
                "gated": "manual",
                "siblings": [{"rfilename": "config.json"}, {"rfilename": "model.safetensors"}],
            }
            self._reply(200, body)
        else:  # the Hub answers 401 + RepoNotFound for missing, private and gated-without-token repos
            self._reply(401, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})

    def _reply(self, status, body, headers=None):
        payload = json.dumps(body).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass
