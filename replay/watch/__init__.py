"""specdiff.replay.watch: ``specdiff watch``, attached to a live traced server.

Each request the serving trace shows finished (``follow``) is replayed on the training side
(``replay.record.train_side.TrainSide``, the code ``record train`` runs) into a training trace
in the watch folder, diffed against its serving rows (``replay.diff.pipeline.diff_opened`` on the
two traces restricted to that request), and reported: a rolling per-depth acceptance of both
sides (``rolling``) and an alert as soon as a divergence is proved (``watcher``). What was
replayed is kept in the watch folder (``state``), so a restarted watch resumes where it stopped.
"""
