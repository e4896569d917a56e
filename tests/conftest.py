pytest_plugins = ["kdist.pytest_plugin"]
