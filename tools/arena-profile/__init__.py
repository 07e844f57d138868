"""arena-profile: thin command-line front end; all logic lives in libarena.profile."""
