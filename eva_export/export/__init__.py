"""Quality split, staged pair publication and export jobs."""
