"""The process shell: supervisor, HTTP server, sd_notify, and the daemon's wiring."""
