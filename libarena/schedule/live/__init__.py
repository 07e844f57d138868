"""Live cluster mode: the simulator's policies against real (optionally compressed) time.

``arena-schedule serve`` runs a :class:`~libarena.schedule.live.cluster.LiveCluster` (the Simulator's state
and actions, with launches handed to a :class:`~libarena.schedule.live.launchers.JobLauncher` instead of being
predicted) in a loop driven by a :class:`~libarena.schedule.live.clock.VirtualClock`. Every piece of state lives
in SQLite (:mod:`~libarena.schedule.live.store`), so the server can be killed at any point and restarted:
launch records are written before launching and reconciled with the launcher on restart.
Submission, status and logs go through the database, so the CLI needs no network server.
"""
