"""Closed loop on a recording: the recorded center frames reprojected to the pose the car's own steering reached
(camera.py), a kinematic bicycle relative to the recorded path (vehicle.py), the environment (env.py) and its
EnvSpec (spec.py; ``envs.registry.get_spec("replay:FOLDER")``)."""
