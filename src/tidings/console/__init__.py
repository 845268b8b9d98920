"""The operator's web console: the deployment at a glance, and the incomplete events acted
on from a browser.

A Starlette application on uvicorn, like the streams, with server-rendered pages (Jinja2)
and no script beyond a few lines of plain JavaScript. It sits above every part it shows:
it reads the outbox (through :mod:`tidings.pipeline.status` and
:mod:`tidings.outbox.incomplete`), the supervisor's state (:mod:`tidings.system.state`) and
the servers' addresses, and it acts only through the code the command line uses
(``tidings events``), recording each action in its audit trail.

Modules, bottom first: ``logins`` (users, sessions, CSRF tokens, the login throttle),
``audit`` (the trail), ``history`` (the sampled figures and their plots),
``intermediaries`` (each one's own metrics), ``overview`` (the state of every part),
``browse`` (the incomplete events, paged, and one event), ``routes`` (the routing table in
force), ``tail`` (the live tail), ``actions`` (what an operator may do, audited), ``app``
(the pages), ``runner`` (``tidings console``).
"""
