"""leoflow's reapers (DESIGN §3 "Reap"): each a pure ``decide(snapshot, now, settings) -> actions`` plus a thin
``act`` in the executor, run after reconcile and only once the settling gate is open."""
