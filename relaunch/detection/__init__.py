"""Pure detection logic: signatures, attribution, hang detection."""
