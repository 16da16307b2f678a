"""Reports of experiments: tables, figures (the only matplotlib user) and the HTML page."""
