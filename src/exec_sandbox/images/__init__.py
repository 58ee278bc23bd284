"""The guest images: locating them (catalog) and building them (`sbx setup`)."""
