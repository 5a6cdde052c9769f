"""Pure detection logic: signatures, attribution, hang detection (the attribution milestone)."""
