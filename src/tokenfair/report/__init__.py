"""Reports of experiments: tables, figures and the HTML page (the only package that
draws: matplotlib)."""
