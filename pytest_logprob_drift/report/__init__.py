"""Reports of a run directory: what is shown (``summary``) and the HTML page (``html``)."""
