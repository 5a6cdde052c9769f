"""Pure detection logic: the signature catalogue and scanner, Xids, progress and stragglers,
node-health checks, attribution and planning. It reads files (its catalogues, a bundle) and
talks to no cluster or service."""
