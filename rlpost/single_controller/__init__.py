"""Single controller: the driver holds the loop, worker groups run @register-ed methods remotely."""
