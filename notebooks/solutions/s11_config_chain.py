team_config = """\
approvals:
  yolo: on
  deny: ['*git push *--force*', '*git push -f', '*git push -f *', '*git push * -f', '*git push * -f *']
max_iterations: 12
"""
