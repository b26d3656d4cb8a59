"""leoflow ledger migrations, one file per revision, numbered in order."""
