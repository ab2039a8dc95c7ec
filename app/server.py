"""The dashboard as Streamlit serves it: the pages of ``streamlit_app.py`` behind a Host
header allow-list.

``streamlit run`` serves a script that defines an ``st.App`` through its Starlette and
Uvicorn server with the app's own middleware (``streamlit/web/server/app_discovery.py``
finds ``app`` below; ``streamlit.starlette.App``'s ``middleware`` runs before
Streamlit's). Starlette's ``TrustedHostMiddleware`` answers a request whose ``Host``
header names another host with 400, on plain HTTP and on the WebSocket handshake alike
(its denial response is sent as ``websocket.http.response.*``). A server bound to
127.0.0.1 is still reachable from a web page through DNS rebinding (a name of the
attacker's that resolves to 127.0.0.1): the browser then sends the attacker's name as
``Host``, and this refuses it, path box and uploads included.
"""

from __future__ import annotations

import os

from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from streamlit.starlette import App

from app.command import ENTRYPOINT, ENV_HOSTS, LOOPBACK_HOSTS

# The host names the page answers to: loopback, and the one `kvpool dashboard --host`
# names (a tunnel's or a reverse proxy's).
ALLOWED_HOSTS = [*LOOPBACK_HOSTS, *(h for h in os.environ.get(ENV_HOSTS, "").split(",") if h)]

app = App(
    str(ENTRYPOINT),
    middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=ALLOWED_HOSTS)],
)
