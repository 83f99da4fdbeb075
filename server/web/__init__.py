"""The HTTP face: one router per concern, and the security middleware in front of all of them."""
