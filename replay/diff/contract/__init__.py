"""The contract stage (pipeline stages 1, 3, 9 and 11): the two traces' recorded facts side by side.
``facts`` is the one table of every fact the diff knows (one row each: its first stage, fix, and for a
worded field its severity, message, the stages it shows at and can cause, its fix in each engine's terms);
``not_compared`` what is never compared; ``check`` refuses two different targets and compares the
contracts once per diff (``check_contracts``), with ``fact_diff`` for every fact it does not word itself;
``crash`` reads a side's engine crash and ``findings`` the pre-flight findings that bear on a divergence.
It reads types.py and causes.py only."""
