"""leoflow's attempt ledger (DESIGN §2): states, tables, the guarded-write store and the DB manager.

Import from the submodules (``states``, ``models``, ``store``, ``db_manager``); this package keeps no
re-exports so that importing ``states`` stays free of SQLAlchemy.
"""
