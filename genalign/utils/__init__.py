"""Small shared helpers (images, progress bars)."""
