rescued = m.restore(2, "src/app.py")
