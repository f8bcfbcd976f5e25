rescued = (project / "src" / "app.py").write_text(m.git("show", f"{m.list()[1].id}:src/app.py"))
